"""`chunkpilot demo`, the main job end to end: profile this machine briefly, train and register
(through the promotion gate), serve the champion, then compare `auto`, fixed 1024 and the hand
rule on a set of prompts with the evaluator (engine/evaluate.py): TTFT and regret per prompt and
policy, and auto's saving over each with its 95% interval."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from chunkpilot.contract import number
from engine.evaluate import PromptCase

from .processes import free_port, start_service, wait_ready

HELP = "the main job: profile briefly, train, serve, and compare auto vs fixed 1024 vs the hand rule"
# lengths and attention set-ups not in the demo's own profile grid
PROMPTS = [
    PromptCase(1200),
    PromptCase(3000),
    PromptCase(3000, 1024, "shift"),
    PromptCase(6000, 512, "ring"),
    PromptCase(2500, 256, "ring", 4),
    PromptCase(9000, 2048, "shift"),
]


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile-minutes", default="3", help="budget of the profile of this machine")
    parser.add_argument("--spec", type=Path, default=Path("data/specs/demo.yaml"))
    parser.add_argument("--data", type=Path, default=Path("data/ttft"), help="profiled data to train on")
    parser.add_argument("--model", default="llama-tiny", help="the engine's model for the comparison")
    parser.add_argument(
        "--max-rounds", default="8", help="most measuring rounds of the comparison (at least 3 unless fewer)"
    )


def _step(n: int, text: str, start: float) -> None:
    print(f"\n[{n}/5 at {time.monotonic() - start:.0f} s] {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    from chunkpilot.dataset import read_dataset
    from profiler.run import log_run, open_run, run_profile
    from profiler.spec import Spec
    from training.train import train_and_report

    minutes = number("profile_minutes", args.profile_minutes, float, gt=0, le=60)
    max_rounds = number("max_rounds", args.max_rounds, int, ge=1, le=50)
    start = time.monotonic()
    spec = Spec.from_file(args.spec)
    _step(1, f"profiling this machine for up to {minutes:g} min ({args.spec}), beside the shipped data", start)
    publisher = open_run(spec, args.data)
    report = run_profile(spec, args.data, minutes, publisher)
    log_run(publisher, spec, report, read_dataset(report.directory), minutes)

    _step(2, f"training on every profiled row under {args.data} and registering through the promotion gate", start)
    print(train_and_report(args.data), flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _step(3, f"starting the service (chunkpilot serve) on {url}", start)
    service = start_service(port, explore_budget=0)  # the comparison asks for the model's own picks
    try:
        wait_ready(url, service)
        _step(
            4,
            f"{args.model}: {len(PROMPTS)} prompts, every chunk size (each policy's choice among them) per "
            f"round, rounds until auto's savings are settled (at most {max_rounds})",
            start,
        )
        table = compare_with_service(args.model, url, max_rounds)
    finally:
        service.terminate()
        service.wait(timeout=20)
    _step(5, "stopped the service", start)
    print(table)
    print(
        "\nMLflow: .venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --port 5000  "
        "(experiment chunk-size: tick the runs, press Compare)"
    )
    print(f"demo finished in {(time.monotonic() - start) / 60:.1f} min")
    return 0


def compare_with_service(model: str, url: str, max_rounds: int, cases: list | None = None) -> str:
    """The demo's comparison: `auto` asking the service, fixed 1024 and the hand rule, measured by
    the one evaluator (engine/evaluate.py) until the savings are settled or `max_rounds` pass."""
    from engine.engine import Engine, EngineConfig
    from engine.evaluate import evaluate, format_evaluation
    from engine.hardware import local_hardware
    from engine.policy import FixedPolicy, RulePolicy
    from engine.predictor_client import AutoPolicy

    engine = Engine(EngineConfig(model=model))
    auto = AutoPolicy(url, 0.05, local_hardware(engine.config.dtype, engine.runtime.threads))
    policies = {"auto": auto, "fixed 1024": FixedPolicy(1024, capped=True), "hand rule": RulePolicy()}
    try:
        result = evaluate(
            engine,
            policies,
            cases or PROMPTS,
            [("auto", "hand rule"), ("auto", "fixed 1024")],
            min_rounds=min(3, max_rounds),
            max_rounds=max_rounds,
        )
    finally:
        auto.close()
    return format_evaluation(result)
