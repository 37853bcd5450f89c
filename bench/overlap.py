"""Does preparing the next request during the current prefill pay? A stream of prompts through one
engine with `auto` asking a real `chunkpilot serve` on loopback, served with and without the overlap
(engine/stream.py), alternating which goes first, `--rounds` times after a warm-up of each; a fresh
client per stream, so every decision is asked over HTTP, never answered by the client's cache.
Telemetry is off: the overlap alone is measured. Each TTFT counts from the moment the engine turns to
the request. Needs a champion in the MLflow store: run `chunkpilot train` (or `make demo`) first.

    .venv/bin/python bench/overlap.py [--model llama-tiny] [--rounds 5]
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
from preamble import model_and_rounds

from auto.client import make_auto
from chunkpilot.contract import AttentionConfig
from cli.processes import free_port, start_service, wait_ready
from engine.engine import Engine
from engine.stream import stream
from engine.workload import Workload

# the deployment's prompts: lengths that differ, windows on some (each a bucket of its own)
PROMPTS = [
    (900, None),
    (4100, 1024),
    (2300, None),
    (6200, 2048),
    (1400, 512),
    (3300, None),
    (700, None),
    (5100, 1024),
    (1900, None),
    (2700, 512),
]


def run_once(engine: Engine, url: str, batch: list[Workload], overlap: bool) -> list:
    policy = make_auto(engine.hardware(), service=url, timeout_s=0.5)
    try:
        return list(stream(engine, batch, policy, overlap))
    finally:
        policy.close()


def main() -> None:
    args, engine = model_and_rounds(__doc__)
    batch = [Workload(n, AttentionConfig(window=w), seed=i) for i, (n, w) in enumerate(PROMPTS)]
    batch = [dataclasses.replace(w, text=engine.text(w)) for w in batch]  # the words before any timing
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = start_service(port, explore_budget=0)
    runs: dict[bool, list[list]] = {False: [], True: []}
    try:
        wait_ready(url, service)
        for overlap in (False, True):  # warm-up of both paths, not kept
            run_once(engine, url, batch, overlap)
        for r in range(args.rounds):
            for overlap in (r % 2 == 0, r % 2 == 1):
                runs[overlap].append(run_once(engine, url, batch, overlap))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        service.terminate()
        service.wait(timeout=20)

    def median(overlap: bool, i: int, name: str) -> float:
        return statistics.median(getattr(run[i], name) for run in runs[overlap])

    def before_prefill(overlap: bool, i: int) -> float:  # what the request waits for before its prefill starts
        return statistics.median(run[i].ttft_ms - run[i].prefill_ms - run[i].first_decode_ms for run in runs[overlap])

    print(f"\n{args.model}, {len(PROMPTS)} prompts, {args.rounds} rounds; medians in ms; decision = the HTTP ask")
    print(
        f"{'#':>3}{'tokens':>7}{'window':>7}{'chunk':>6}{'tokenize':>9}{'decision':>9}"
        f"{'TTFT off':>10}{'TTFT on':>9}{'on/off':>8}{'pre-prefill share off':>23}{'on':>7}"
    )
    for i, (n, w) in enumerate(PROMPTS):
        off, on = median(False, i, "ttft_ms"), median(True, i, "ttft_ms")
        print(
            f"{i + 1:>3}{n:>7}{w or '-':>7}{runs[False][0][i].chunk_size:>6}{median(False, i, 'tokenize_ms'):>9.1f}"
            f"{median(False, i, 'decision_ms'):>9.2f}{off:>10.1f}{on:>9.1f}{on / off:>8.3f}"
            f"{before_prefill(False, i) / off:>23.2%}{before_prefill(True, i) / on:>7.2%}"
        )
    totals = np.array([[sum(x.ttft_ms for x in run) for run in runs[o]] for o in (False, True)])  # [2, rounds]
    saving = 1 - totals[1] / totals[0]  # per round, paired
    boot = np.random.default_rng(0).choice(saving, (2000, len(saving))).mean(1)
    low, high = np.quantile(boot, [0.025, 0.975])
    share = np.mean([sum(x.decision_ms for x in run) / sum(x.ttft_ms for x in run) for run in runs[False]])
    print(
        f"\ntotal TTFT saved by the overlap: {saving.mean():.2%} [95% CI {low:.2%}, {high:.2%}] "
        f"(paired per round, bootstrap); the decision is {share:.2%} of TTFT without it"
    )
    print(
        "(the first request has nothing to hide behind; 'pre-prefill share': tokenize + decision, or waiting for "
        "them, in the TTFT)"
    )


if __name__ == "__main__":
    main()
