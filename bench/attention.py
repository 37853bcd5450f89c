"""The two attention kernels of the bundled engine side by side in one process: `sdpa` (a dense mask
[1, 1, Q, K] per chunk, so PyTorch's CPU flash kernel computes every key) against `split` (only the
visible blocks, merged by log-sum-exp), at each chunk size and attention layout.

Same weights (same preset and seed), same prompt; every (kernel, chunk) pair runs once per round,
the order rotated each round, after a warm-up round. Prints per chunk size the median prefill ms of
each kernel, their ratio with its paired 95% interval, and the share of this machine's matmul peak
(measured in this process) that the prompt's own FLOPs reach (chunkpilot.features.prefill_flops);
then one shot over the best chunked size per kernel (under a window, the window's saving).

    .venv/bin/python bench/attention.py [--model mistral-44m] [--tokens 4096] [--window 1024]
        [--layouts none,shift,ring] [--chunks 256,512,768,1024,2048] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from chunkpilot.contract import AttentionConfig
from chunkpilot.features import prefill_flops
from engine.config import EngineConfig
from engine.engine import Engine
from engine.measure import interleaved, median_ratio
from engine.policy import FixedPolicy
from engine.workload import Workload

KERNELS = ("sdpa", "split")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mistral-44m")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--layouts", default="none,shift,ring")
    parser.add_argument("--chunks", default="256,512,768,1024,2048")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    engines = {k: Engine(EngineConfig(model=args.model, attn_impl=k, threads=args.threads)) for k in KERNELS}
    peak = engines["split"].hardware().matmul_gflops
    rng = np.random.default_rng(0)
    threads = engines["split"].runtime.threads
    print(f"{args.model}, {args.tokens} tokens, fp32, {threads} threads; matmul peak {peak:.0f} GFLOP/s")
    for layout in args.layouts.split(","):
        attention = AttentionConfig() if layout == "none" else AttentionConfig(window=args.window, layout=layout)
        chunks = [int(c) for c in args.chunks.split(",")]
        chunks = [c for c in chunks if layout != "ring" or c <= args.window]
        if layout != "ring":
            chunks.append(args.tokens)  # one shot (the ring takes at most a window per step)
        workload = Workload(context_length=args.tokens, attention=attention)
        tokens: dict[tuple[str, int], int] = {}

        def step(kernel: str, chunk: int, workload: Workload = workload, tokens: dict = tokens) -> float:
            result = engines[kernel].run(workload, FixedPolicy(chunk))
            tokens[kernel, chunk] = result.first_token
            return result.prefill_ms

        steps = {(k, c): (lambda k=k, c=c: step(k, c)) for k in KERNELS for c in chunks}
        ms = interleaved(steps, args.rounds, warmup=1)
        engine = engines["split"]
        row = engine.request(args.tokens, attention).row(engine.hardware().model_dump())
        gflop = float(prefill_flops(row)[0]) / 1e9
        name = "no window" if layout == "none" else f"window {args.window}, {layout}"
        print(f"\n{name}:   chunk   sdpa ms  split ms   sdpa/split [95% interval]   split % of peak")
        for c in chunks:
            a, b = ms["sdpa", c], ms["split", c]
            ratio, low, high = median_ratio(a, b, rng)
            share = gflop / (statistics.median(b) / 1e3) / peak
            label = "one shot" if c == args.tokens else str(c)
            print(
                f"{label:>18}{statistics.median(a):>10.0f}{statistics.median(b):>10.0f}"
                f"{ratio:>12.2f} [{low:.2f}, {high:.2f}]{share:>17.0%}"
            )
        for k in KERNELS:
            best = min((c for c in chunks if c != args.tokens), key=lambda c: statistics.median(ms[k, c]))
            line = f"  {k}: best chunk {best} ({statistics.median(ms[k, best]):.0f} ms)"
            if args.tokens in chunks:
                r, lo, hi = median_ratio(ms[k, args.tokens], ms[k, best], rng)
                line += f", one shot / best {r:.2f} [{lo:.2f}, {hi:.2f}]"
            print(line)
        same = len({tokens[k, c] for k in KERNELS for c in chunks}) == 1
        print(f"  first tokens {'agree' if same else 'DIFFER'} across kernels and chunk sizes")


if __name__ == "__main__":
    main()
