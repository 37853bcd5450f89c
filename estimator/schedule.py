"""A chunk schedule chosen by the per-chunk cost model: the cheapest path over chunk boundaries.

The path's steps are the TTFT model's best few sizes (STEPS), the boundaries multiples of their
greatest common divisor: a size joins only while a prompt keeps at most MAX_BOUNDARIES of them,
so the search predicts about a hundred chunks at most and the decision stays within the plain
answer's latency budget. From each boundary a chunk of any step size goes on; the last chunk may be
cut short (as a uniform size's is), and the whole prompt in one chunk is a path when the layout
allows it. Every uniform step size is one of these paths, so the schedule is never predicted slower
than the TTFT model's own pick run uniformly. The chunks of every (boundary, size) pair are
predicted in one call; the walk is plain Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

STEPS = 3  # the TTFT model's best sizes that a schedule may mix
MAX_BOUNDARIES = 32  # per prompt: with STEPS, ~100 chunk predictions (~0.1 ms) at most


def search_steps(sizes: list[int], n: int, limit: int) -> tuple[list[int], int] | None:
    """(step sizes, boundary grid) for a prompt of `n` tokens: `sizes` best first, `limit` the
    largest chunk the layout takes. ([], n) when no size is shorter than the prompt (one chunk);
    None when even the best size would need more than MAX_BOUNDARIES boundaries."""
    fitting = [s for s in sizes if s <= limit and s < n][:STEPS]
    steps, grid = [], 0
    for size in fitting:
        if n / math.gcd(grid, size) <= MAX_BOUNDARIES:
            steps, grid = [*steps, size], math.gcd(grid, size)
    return None if fitting and not steps else (steps, grid or n)


ChunkMs = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (config rows, q, h) -> ms per chunk


def best_schedule(
    chunk_ms: ChunkMs, config: np.ndarray, n: int, sizes: list[int], limit: int
) -> tuple[list[int], float] | None:
    """(chunk sizes in order summing to `n`, their predicted prefill ms), or None when no size
    makes a small enough search. `chunk_ms` prices chunks (estimator.recipe.Recipe.chunk_ms);
    `config` [FEATURES] is the request's feature row; `sizes` the candidate sizes, best first."""
    found = search_steps(sizes, n, limit)
    if found is None:
        return None
    steps, grid = found
    longest = max(steps, default=n)

    def chunks_from(h: int) -> list[int]:  # a step, or the rest: cut short, or the whole prompt at once
        rest = n - h
        return [s for s in steps if s < rest] + ([rest] if rest <= limit and (rest <= longest or h == 0) else [])

    edges = [(h, q) for h in range(0, n, grid) for q in chunks_from(h)]
    h, q = (np.array(v, dtype=float) for v in zip(*edges, strict=True))
    ms = chunk_ms(np.repeat(config[None], len(edges), axis=0), q, h)
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
