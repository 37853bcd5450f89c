"""A chunk schedule chosen by the per-chunk cost model: the cheapest path over chunk boundaries.

Boundaries are sums of candidate sizes, on a grid: multiples of GRID tokens where enough sizes are,
else of their greatest common divisor, coarsened until a prompt has at most MAX_BOUNDARIES of them
(sizes off the grid drop out), so that no request can make the search slow. From each boundary a
chunk of any candidate size goes on, or the rest of the prompt in one last chunk when the layout
allows it. Every uniform size on the grid is one of these paths, so the schedule is never predicted
slower than the best of them. The model's chunks of every (boundary, size) pair are predicted in
one call; the walk is plain Python.
"""

from __future__ import annotations

import math

import numpy as np

from chunkpilot.chunk_features import predict_chunk_ms

GRID = 256  # tokens between boundaries: 256 keeps a 12k prompt to ~50 boundaries (the decision's budget)
MAX_BOUNDARIES = 128


def best_schedule(booster, config: np.ndarray, n: int, sizes: list[int], limit: int) -> tuple[list[int], float] | None:
    """(chunk sizes in order summing to `n`, their predicted prefill ms), or None when no candidate
    size fits the grid. `config` [FEATURES] is the request's feature row; `sizes` the candidate
    sizes; `limit` the largest chunk the layout takes."""
    fitting = sorted({s for s in sizes if s <= limit and s < n})
    grid = GRID if any(s % GRID == 0 for s in fitting) else math.gcd(*fitting) if fitting else n
    grid *= max(1, math.ceil(n / (grid * MAX_BOUNDARIES)))  # coarser for long prompts
    steps = [s for s in fitting if s % grid == 0]
    if fitting and not steps:
        return None
    edges = [(h, q) for h in range(0, n, grid) for q in [*(s for s in steps if h + s < n), n - h] if q <= limit]
    h, q = (np.array(v, dtype=float) for v in zip(*edges, strict=True))
    ms = predict_chunk_ms(booster, np.repeat(config[None], len(edges), axis=0), q, h)
    best: dict[int, tuple[float, int]] = {0: (0.0, 0)}  # boundary -> (cost so far, the chunk that reached it)
    for (start, size), cost in zip(edges, ms.tolist(), strict=True):  # edges go in boundary order
        if start in best:
            total, end = best[start][0] + cost, start + size
            if end not in best or total < best[end][0]:
                best[end] = (total, size)
    if n not in best:
        return None
    schedule, at = [], n
    while at:
        schedule.append(best[at][1])
        at -= best[at][1]
    return schedule[::-1], best[n][0]
