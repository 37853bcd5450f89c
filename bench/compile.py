"""Does `torch.compile` pay for the bundled engine's prefill? The engine with and without
`--compile` (torch.compile(dynamic=True) over the model's forward) on the same weights and prompt,
in one process: the first prefill of each (what compiling costs, once per process and shape
family), then TTFT over interleaved rounds after a warm-up, their paired ratio with its 95%
interval, and how many prompts the compile time takes to pay back where the compiled one is faster.

    .venv/bin/python bench/compile.py [--configs llama-tiny:2048:512,mistral-44m:4096:1024] [--rounds 5]
        [--attn-impl split|masked]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from chunkpilot.contract import ConfigError, number
from engine.config import EngineConfig
from engine.engine import Engine
from engine.measure import interleaved
from engine.policy import FixedPolicy
from engine.workload import Workload
from judge.intervals import median_ratio


def first_run_s(engine: Engine, workload: Workload, chunk: int) -> float:
    t0 = time.perf_counter()
    engine.run(workload, FixedPolicy(chunk))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="llama-tiny:2048:512,mistral-44m:4096:1024", help="model:tokens:chunk,...")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attn-impl", choices=["split", "masked"], default=None, help="default: the engine's")
    args = parser.parse_args()
    try:
        number("rounds", args.rounds, int, ge=1, le=1000)
        configs = [
            (m, number("configs", n, int, ge=1), number("configs", c, int, ge=1))
            for m, n, c in (text.split(":") for text in args.configs.split(","))
        ]
    except (ConfigError, ValueError) as exc:
        parser.error(f"configs: model:tokens:chunk,... ({exc})")
    rng = np.random.default_rng(0)
    print(
        f"{'config':<26}{'first eager s':>14}{'first compiled s':>17}{'eager ms':>10}{'compiled ms':>12}"
        f"   compiled/eager [95%]   prompts to pay back"
    )
    for model, tokens, chunk in configs:
        workload, text = Workload(tokens), f"{model}:{tokens}:{chunk}"
        engines = {
            flag: Engine(EngineConfig(model=model, compile=flag, attn_impl=args.attn_impl)) for flag in (False, True)
        }
        first = {flag: first_run_s(engine, workload, chunk) for flag, engine in engines.items()}
        policy = FixedPolicy(chunk)
        steps = {flag: (lambda e=e, w=workload, p=policy: e.run(w, p).ttft_ms) for flag, e in engines.items()}
        ms = interleaved(steps, args.rounds)
        eager, compiled = statistics.median(ms[False]), statistics.median(ms[True])
        ratio, low, high = median_ratio(ms[True], ms[False], rng)
        saved_ms = eager - compiled
        payback = f"{(first[True] - first[False]) * 1e3 / saved_ms:.0f}" if high < 1 else "never (no saving seen)"
        print(
            f"{text:<26}{first[False]:>14.1f}{first[True]:>17.1f}{eager:>10.0f}{compiled:>12.0f}"
            f"   {ratio:.3f} [{low:.3f}, {high:.3f}]   {payback}",
            flush=True,
        )


if __name__ == "__main__":
    main()
