"""`chunkpilot demo`, the main job end to end: profile this machine briefly, train and register
(through the promotion gate), serve the champion, then run the engine on a set of prompts under
`auto`, fixed 1024 and the hand rule, interleaved with a sweep of every chunk size that finds the
measured best, and print TTFT and regret per prompt and policy."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from chunkpilot.config import DEFAULT_CHUNKS, AttentionConfig, ConfigError, check_float, check_int, feasible_chunks

HELP = "the main job: profile briefly, train, serve, and compare auto vs fixed 1024 vs the hand rule"
# (tokens, window, layout, sinks): lengths and attention set-ups not in the demo's own profile grid
PROMPTS = [(1200, None, "shift", 0), (3000, None, "shift", 0), (3000, 1024, "shift", 0),
           (6000, 512, "ring", 0), (2500, 256, "ring", 4), (9000, 2048, "shift", 0)]


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile-minutes", default="3", help="budget of the profile of this machine")
    parser.add_argument("--spec", type=Path, default=Path("data/specs/demo.yaml"))
    parser.add_argument("--data", type=Path, default=Path("data/ttft"), help="profiled data to train on")
    parser.add_argument("--model", default="llama-tiny", help="the engine's model for the comparison")
    parser.add_argument("--repeats", default="2", help="measured repeats per prompt and policy")


def _step(n: int, text: str, start: float) -> None:
    print(f"\n[{n}/5 at {time.monotonic() - start:.0f} s] {text}", flush=True)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(port: int, **settings: object) -> subprocess.Popen:
    """`chunkpilot serve` in a new process; `settings` become its CHUNKPILOT_* environment."""
    from chunkpilot.tracking import tracking_uri

    settings = {"tracking_uri": tracking_uri(), "poll_interval_s": 0, **settings}
    env = {**os.environ, **{f"CHUNKPILOT_{k.upper()}": str(v) for k, v in settings.items()}}
    return subprocess.Popen([sys.executable, "-m", "chunkpilot.cli", "serve", "--port", str(port)], env=env)


def answers(url: str) -> bool:
    """GET `url` gives 200 (False while nothing listens or it says otherwise)."""
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if answers(f"{url}/readyz"):
            return
        time.sleep(0.3)
    raise RuntimeError(f"the service at {url} did not become ready")


def run(args: argparse.Namespace) -> int:
    from profiler.run import log_run, run_profile
    from profiler.spec import Spec
    from profiler.store import read_dataset
    from training.train import format_result, train

    minutes = check_float("profile_minutes", args.profile_minutes, 0, 60)
    repeats = check_int("repeats", args.repeats, 1, 20)
    start = time.monotonic()
    spec = Spec.from_file(args.spec)
    _step(1, f"profiling this machine for up to {minutes:g} min ({args.spec}), beside the shipped data", start)
    report = run_profile(spec, args.data, minutes)
    log_run(spec, args.data, report, read_dataset(args.data / spec.name), minutes)

    _step(2, f"training on every profiled row under {args.data} and registering through the promotion gate", start)
    print(format_result(train(args.data)), flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _step(3, f"starting the service (chunkpilot serve) on {url}", start)
    service = start_service(port)
    try:
        wait_ready(url, service)
        _step(4, f"{args.model}: {len(PROMPTS)} prompts x (auto, fixed 1024, hand rule, every chunk size), "
                 f"{repeats} interleaved repeats after a warm-up", start)
        table = compare_with_service(args.model, url, repeats)
    finally:
        service.terminate()
        service.wait(timeout=20)
    _step(5, "stopped the service", start)
    print(table)
    print("\nMLflow: .venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --port 5000  "
          "(experiment chunk-size: tick the runs, press Compare)")
    print(f"demo finished in {(time.monotonic() - start) / 60:.1f} min")
    return 0


def compare_with_service(model: str, url: str, repeats: int, prompts: list[tuple] = PROMPTS) -> str:
    """The demo's comparison: `auto` asking the service, fixed 1024 and the hand rule."""
    from engine.engine import Engine, EngineConfig
    from engine.policy import FixedPolicy, RulePolicy
    from engine.predictor_client import AutoPolicy, local_hardware

    engine = Engine(EngineConfig(model=model))
    auto = AutoPolicy(url, 0.05, local_hardware(dtype="float32", threads=engine.runtime.threads))
    try:
        return compare(engine, {"auto": auto, "fixed 1024": FixedPolicy(1024, capped=True), "hand rule": RulePolicy()},
                       repeats, prompts)
    finally:
        auto.close()


def compare(engine, policies: dict, repeats: int, prompts: list[tuple]) -> str:
    """Measure every prompt under each policy and every feasible chunk size, interleaved; a policy
    a prompt cannot run (one shot on a ring longer than its window) gets no cell."""
    from engine.engine import Prompt
    from engine.policy import FixedPolicy

    runs: dict[tuple, list] = {}
    texts = {n: engine.prompt_text(Prompt(num_tokens=n)) for n, *_ in prompts}
    for repeat in range(repeats + 1):  # pass 0 is the warm-up
        for n, window, layout, sinks in prompts:
            attention = AttentionConfig(window, layout, sinks)
            sweep, _ = feasible_chunks(DEFAULT_CHUNKS, n, window, layout)
            contenders = {**policies, **{c: FixedPolicy(c) for c in sweep}}
            for name, policy in contenders.items():
                try:
                    result = engine.run(texts[n], n, attention, policy)
                except ConfigError:
                    continue
                if repeat:
                    runs.setdefault((n, window, layout, sinks, name), []).append(result)
    return format_table(runs, list(policies), prompts)


def format_table(runs: dict[tuple, list], policies: list[str], prompts: list[tuple]) -> str:
    """Per prompt: each policy's chunk size, median TTFT and regret against the measured best
    (the fastest size of the sweep); totals over the prompts every policy could run."""
    lines = [f"{'prompt':<28}" + "".join(f"{p:>22}" for p in policies) + f"{'measured best':>22}"]
    medians: list[dict] = []
    for n, window, layout, sinks in prompts:
        mine = {name: results for (*k, name), results in runs.items() if tuple(k) == (n, window, layout, sinks)}
        median = {name: statistics.median(r.ttft_ms for r in results) for name, results in mine.items()}
        best = min((m for m in median if isinstance(m, int)), key=median.get)
        median["best"] = median[best]
        medians.append(median)
        label = f"{n} tok, " + ("no window" if window is None else f"w{window} {layout}" + (f" s{sinks}" if sinks else ""))
        cells = [f"{mine[p][0].chunk_size:>5} {median[p]:>7.0f}ms {median[p] / median[best] - 1:>+5.0%}"
                 if p in median else "n/a" for p in policies]
        lines.append(f"{label:<28}" + "".join(f"{c:>22}" for c in cells) + f"{best:>5} {median[best]:>7.0f}ms      ")
    common = [m for m in medians if all(p in m for p in policies)]
    totals = [sum(m[p] for m in common) for p in [*policies, "best"]]
    regrets = [statistics.fmean(m[p] / m["best"] - 1 for m in medians if p in m) for p in policies]
    lines.append(f"{f'total TTFT ({len(common)} prompts)':<28}" + "".join(f"{t:>19.0f}ms " for t in totals))
    lines.append(f"{'mean regret vs best':<28}" + "".join(f"{r:>21.1%} " for r in regrets))
    sources = {r.decision_source for (*_, name), results in runs.items() if name == "auto" for r in results}
    lines.append("cells: chunk size, median TTFT, regret against the measured best"
                 + (f"; auto's decisions came from: {', '.join(sorted(sources))}" if sources else ""))
    return "\n".join(lines)
