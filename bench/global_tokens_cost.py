"""What selective SWA costs: TTFT with 0, 8 and 64 global tokens (spread over the prompt, visible to
every later query besides the window), at a few lengths, both layouts, the hand rule's chunk size;
the three counts interleaved and rotated in one run after a warm-up, ratios to no global tokens
with bootstrap 95% intervals over the rounds, and the KV cache each leaves.

    .venv/bin/python bench/global_tokens_cost.py [--model llama-tiny] [--rounds 5]
"""

from __future__ import annotations

import functools

import numpy as np
from preamble import model_and_rounds

from chunkpilot.contract import AttentionConfig
from engine.measure import interleaved
from engine.policy import RulePolicy
from engine.workload import Workload
from judge.intervals import median_ratio

COUNTS = (0, 8, 64)
SETUPS = [(n, window, layout) for n in (2048, 4096, 8192) for window, layout in ((512, "shift"), (1024, "ring"))]


def main() -> None:
    args, engine = model_and_rounds(__doc__)
    rng = np.random.default_rng(0)
    print(f"{args.model}; TTFT ms (median over {args.rounds} rounds) and the ratio to no global tokens [95% CI]")
    print(
        f"{'tokens':>7}{'window':>12}{'chunk':>6}"
        + "".join(f"{f'{g} global':>30}" for g in COUNTS)
        + "  KV MiB (0/8/64)"
    )
    for n, window, layout in SETUPS:

        def run(count: int, window: int = window, layout: str = layout, n: int = n):
            attention = AttentionConfig(window=window, layout=layout, global_tokens=count)
            return engine.run(Workload(n, attention), RulePolicy())

        results = interleaved({g: functools.partial(run, g) for g in COUNTS}, args.rounds)
        times = {g: np.array([r.ttft_ms for r in rs]) for g, rs in results.items()}
        cells = []
        for g in COUNTS:
            ratio, low, high = median_ratio(times[g], times[0], rng)
            cells.append(f"{np.median(times[g]):>9.0f} {ratio:.3f} [{low:.3f}, {high:.3f}]")
        kv = "/".join(f"{results[g][0].kv_cache_bytes / 2**20:.2f}" for g in COUNTS)
        print(
            f"{n:>7}{f'{window} {layout}':>12}{results[0][0].chunk_size:>6}"
            + "".join(f"{c:>30}" for c in cells)
            + f"  {kv}",
            flush=True,
        )
    print("(a ratio whose interval excludes 1: global tokens cost measurably here)")


if __name__ == "__main__":
    main()
