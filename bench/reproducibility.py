"""Do fresh processes agree? The same configs measured in several new processes, one after another.

Each worker process sets up the engine (allocator, threads), warms every config up, then measures
the configs interleaved, R repeats, and reports median TTFTs. The parent prints, per config, the
median from every process and their spread (max/min; target <= 1.10), and per (context, window)
whether every process picked the same best chunk size.

This machine's own speed drifts (a fixed matmul loop slowed 18% within 8 s here, no CPU steal),
which no engine set-up can remove. So each worker also times a fixed matmul burst right before
every run, and the report repeats the table with TTFT / burst time: what is left there is the
process-to-process difference the engine's set-up is responsible for.

    .venv/bin/python bench/reproducibility.py [--processes 3] [--contexts 2048,8192] [--chunks full,768]
    .venv/bin/python bench/reproducibility.py --compare-malloc   # also glibc defaults, alternating
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import subprocess
import sys
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--model", default="mistral-44m")
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--chunks", default="full,768")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compare-malloc", action="store_true", help="also run workers with glibc defaults")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def configs(args: argparse.Namespace) -> list[tuple[int, int | None, str]]:
    contexts = [int(n) for n in args.contexts.split(",")]
    return list(itertools.product(contexts, [None, args.window], args.chunks.split(",")))


def calibration_ms(a, b) -> float:
    """A fixed compute burst (ten 1024^3 matmuls): the machine's speed right now."""
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    return (time.perf_counter() - t0) * 1e3


def worker(args: argparse.Namespace) -> None:
    """One process: warm every config, then interleave repeats; print median TTFT per config,
    raw and divided by the calibration burst timed just before each run."""
    import torch

    from chunkpilot.contract import AttentionConfig
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.measure import interleaved
    from engine.policy import parse_policy
    from engine.workload import Workload

    engine = Engine(EngineConfig(model=args.model, threads=args.threads))
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for n, _, _ in configs(args):  # the words before any timing
        engine.text(Workload(n))

    def timed(n: int, window: int | None, chunk: str) -> tuple[float, float]:
        calib = calibration_ms(a, b)
        result = engine.run(Workload(n, AttentionConfig(window=window)), parse_policy(chunk))
        print(
            f"  {n} tokens, window {window}, chunk {chunk}: {result.ttft_ms:.0f} ms (burst {calib:.0f} ms)",
            file=sys.stderr,
            flush=True,
        )
        return result.ttft_ms, calib

    runs = interleaved({c: functools.partial(timed, *c) for c in configs(args)}, args.repeats)
    out = {
        "allocator": engine.runtime.allocator,
        "raw": {json.dumps(c): statistics.median(t for t, _ in v) for c, v in runs.items()},
        "normalised": {json.dumps(c): statistics.median(t / k for t, k in v) for c, v in runs.items()},
        "burst_ms": statistics.median(k for v in runs.values() for _, k in v),
    }
    print(json.dumps(out))


def spawn(malloc: str) -> dict:
    env = {**os.environ, "CHUNKPILOT_MALLOC": malloc}
    cmd = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(label: str, results: list[dict], args: argparse.Namespace, key: str) -> None:
    unit = "median TTFT ms" if key == "raw" else "median TTFT / calibration burst"
    print(f"\n== {label}: {results[0]['allocator']}, {len(results)} fresh processes, {unit}")
    print(
        f"{'tokens':>6} {'window':>6} {'chunk':>5}  "
        + "".join(f"{'proc ' + str(i + 1):>9}" for i in range(len(results)))
        + f"{'max/min':>9}"
    )
    worst = 1.0
    for c in configs(args):
        values = [r[key][json.dumps(list(c))] for r in results]
        spread = max(values) / min(values)
        worst = max(worst, spread)
        print(
            f"{c[0]:>6} {str(c[1]):>6} {c[2]:>5}  "
            + "".join(f"{v:>9.{0 if key == 'raw' else 2}f}" for v in values)
            + f"{spread:>9.3f}"
        )
    bursts = [r["burst_ms"] for r in results]
    print(
        f"{'calibration burst ms':<20}" + "".join(f"{v:>9.0f}" for v in bursts) + f"{max(bursts) / min(bursts):>9.3f}"
    )
    agree = True
    for n, window in dict.fromkeys((n, w) for n, w, _ in configs(args)):
        best = [min(args.chunks.split(","), key=lambda ch: r[key][json.dumps([n, window, ch])]) for r in results]
        agree &= len(set(best)) == 1
        print(f"best chunk at {n} tokens, window {window}: {' '.join(best)}")
    print(
        f"worst max/min {worst:.3f} (target <= 1.10): {'met' if worst <= 1.10 else 'MISSED'}; "
        f"best chunk the same in every process: {'yes' if agree else 'NO'}"
    )


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args)
    settings = ["pinned", "default"] if args.compare_malloc else ["pinned"]
    results: dict[str, list[dict]] = {s: [] for s in settings}
    for i in range(args.processes):
        for setting in settings:  # alternate, so machine drift hits both alike
            print(f"process {i + 1}/{args.processes} ({setting} allocator)", file=sys.stderr, flush=True)
            results[setting].append(spawn(setting))
    for setting in settings:
        for key in ("raw", "normalised"):
            report(setting, results[setting], args, key)


if __name__ == "__main__":
    main()
