"""`chunkpilot demo`, the main job end to end: profile this machine briefly, train and register
(through the promotion gate), serve the champion, let it learn this machine from a short workload
of its own prefills (telemetry on, bounded exploration), then compare `auto`, fixed 1024 and the
hand rule on other prompts of the same kinds with the evaluator (evaluation/comparison.py): TTFT and
regret per prompt and policy, and auto's saving over each with its 95% interval. The comparison's
own measurements never reach the model (it measures fixed sizes; auto is only asked)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from chunkpilot.contract import AttentionConfig, number
from chunkpilot.paths import DATA_ROOT, SPECS_DIR
from engine.workload import Workload
from predictor.settings import Settings

from .fields import add_fields, build, values
from .processes import free_port, start_service, wait_ready

HELP = "the main job: profile briefly, train, serve, learn from prefills, compare auto vs fixed 1024 vs the hand rule"
# the deployment's own prompts, learnt from: the same kinds as the comparison's (no window, shift and
# ring windows, sinks), none of their lengths or windows
LEARN = [
    Workload(900),
    Workload(2000),
    Workload(4500),
    Workload(2000, AttentionConfig(768, "shift")),
    Workload(5000, AttentionConfig(1536, "shift")),
    Workload(12000, AttentionConfig(1024, "shift")),
    Workload(4000, AttentionConfig(1024, "ring")),
    Workload(1800, AttentionConfig(384, "ring", 4)),
]
LEARN_PASSES = 3  # each learning prompt (other words each time)
# lengths and attention set-ups in neither the demo's profile grid nor the learning workload
PROMPTS = [
    Workload(1200),
    Workload(3000),
    Workload(3000, AttentionConfig(1024, "shift")),
    Workload(6000, AttentionConfig(512, "ring")),
    Workload(2500, AttentionConfig(256, "ring", 4)),
    Workload(9000, AttentionConfig(2048, "shift")),
]


SERVICE_FLAGS = {"explore_budget": ("--explore-budget", "--explore")}  # the learning phase's service


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile-minutes", default="2", help="budget of the profile of this machine")
    parser.add_argument("--spec", type=Path, default=SPECS_DIR / "demo.yaml")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="profiled data to train on")
    parser.add_argument("--model", default="llama-tiny", help="the engine's model for the comparison")
    parser.add_argument(
        "--max-rounds", default="40", help="most measuring rounds of the comparison (at least 5 unless fewer)"
    )
    parser.add_argument(
        "--minutes", default="13", help="the demo's time budget: the comparison adds rounds while they fit in it"
    )
    add_fields(parser, Settings, SERVICE_FLAGS)


STEPS = 6
FULL_ROUNDS = 2  # comparison rounds that time every size (the race for the best), before only the compared
STOP_S = 10  # what the demo does after the comparison: stop the service, print


def _step(n: int, text: str, start: float) -> None:
    print(f"\n[{n}/{STEPS} at {time.monotonic() - start:.0f} s] {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    import httpx

    from chunkpilot.dataset import read_dataset
    from profiler.run import log_run, open_run, run_profile
    from profiler.spec import Spec
    from training.train import train_and_report

    minutes = number("profile_minutes", args.profile_minutes, float, gt=0, le=60)
    max_rounds = number("max_rounds", args.max_rounds, int, ge=1, le=200)
    budget = number("minutes", args.minutes, float, gt=0, le=120)
    explore = build(Settings, **values(args, SERVICE_FLAGS)).explore_budget
    start = time.monotonic()
    spec = Spec.from_file(args.spec)
    _step(1, f"profiling this machine for up to {minutes:g} min ({args.spec}), beside the shipped data", start)
    publisher = open_run(spec, args.data)
    report = run_profile(spec, args.data, minutes, publisher)
    log_run(publisher, spec, report, read_dataset(report.directory), minutes)

    os.environ.setdefault("CHUNKPILOT_FIT_THREADS", str(len(os.sched_getaffinity(0))))  # it trains alone
    _step(
        2,
        f"training on every profiled row under {args.data} and registering through the promotion gate (the "
        "registered recipe beside the baselines a user compares against; `chunkpilot train` judges every recipe "
        "and baseline)",
        start,
    )
    # the registered recipe is the same whatever it is judged beside; the minutes the other recipes'
    # cross-validation would take go to the comparison's rounds
    print(train_and_report(args.data, compare="quick"), flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _step(3, f"starting the service (chunkpilot serve) on {url}, exploring up to {explore:.0%} of served TTFT", start)
    service = start_service(port, explore_budget=explore)
    try:
        wait_ready(url, service)
        _step(
            4,
            f"{args.model}: learning this machine from its own prefills ({len(LEARN)} prompts x {LEARN_PASSES})",
            start,
        )
        print(learn_with_service(args.model, url, LEARN, LEARN_PASSES), flush=True)
    finally:
        service.terminate()
        service.wait(timeout=20)
    service = start_service(port, explore_budget=0)  # the comparison asks for the recipe's own choices
    try:
        wait_ready(url, service)
        learnt = httpx.get(f"{url}/v1/model").json().get("learnt_from_prefills", 0)
        _step(
            5,
            f"restarted the service without exploring (its correction re-learnt from the {learnt} prefills kept in "
            f"its telemetry); {args.model}: {len(PROMPTS)} other prompts, every chunk size (each policy's choice "
            f"among them) for {min(FULL_ROUNDS, max_rounds)} rounds, then only the sizes still compared, rounds "
            f"while they fit in {budget:g} min ({min(5, max_rounds)} to {max_rounds})",
            start,
        )
        table = compare_with_service(args.model, url, max_rounds, deadline=start + budget * 60 - STOP_S)
    finally:
        service.terminate()
        service.wait(timeout=20)
    _step(6, "stopped the service", start)
    print(table)
    print(
        "\nMLflow: .venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --port 5000  "
        "(experiment chunk-size: tick the runs, press Compare)"
    )
    print(f"demo finished in {(time.monotonic() - start) / 60:.1f} min")
    return 0


def learn_with_service(model: str, url: str, workloads: list[Workload], passes: int) -> str:
    """The deployment's own workload through `auto` with telemetry on: each prefill's chunk times go
    to the service, whose correction learns from them at once (and explores within its budget)."""
    import dataclasses

    import httpx

    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.predictor_client import make_auto
    from engine.telemetry import Reporter, to_service

    engine = Engine(EngineConfig(model=model))
    reporter = Reporter(to_service(url), capacity=4096)
    auto = make_auto(engine.hardware(), service=url, timeout_s=0.5, reporter=reporter)
    explored = 0
    try:
        for k in range(passes):
            for workload in workloads:  # other words each pass
                explored += engine.run(dataclasses.replace(workload, seed=k + 1), auto).decision.explored
    finally:
        auto.close()  # flushes the telemetry
    learnt = httpx.get(f"{url}/v1/model").json().get("learnt_from_prefills", 0)
    return (
        f"learning from {reporter.sent} prefills ({explored} explored a candidate other than the recipe's "
        f"choice, {reporter.dropped} dropped): the service's correction now holds {learnt} prefills of this "
        "machine"
    )


def compare_with_service(
    model: str, url: str, max_rounds: int, workloads: list[Workload] | None = None, deadline: float | None = None
) -> str:
    """The demo's comparison: `auto` asking the service, fixed 1024, the hand rule and the simple rule
    (one shot without a window, else the hand rule), measured by the one evaluator
    (evaluation/comparison.py) until the savings are settled, `deadline` passes or `max_rounds` do."""
    from chunkpilot.chunks import simple_rule
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.policy import FixedPolicy, RulePolicy
    from engine.predictor_client import make_auto
    from evaluation.comparison import evaluate, format_evaluation

    engine = Engine(EngineConfig(model=model))
    auto = make_auto(engine.hardware(), service=url)
    policies = {
        "auto": auto,
        "fixed 1024": FixedPolicy(1024, capped=True),
        "hand rule": RulePolicy(),
        "simple rule": RulePolicy("simple-rule", simple_rule),
    }
    workloads = workloads or PROMPTS
    try:
        tabled = auto.warm_up([engine.request(w.context_length, w.attention) for w in workloads])
        print(f"the service's decision table answers {tabled} of {len(workloads)} prompts (built before any timing)")
        result = evaluate(
            engine,
            policies,
            workloads,
            [("auto", "hand rule"), ("auto", "fixed 1024"), ("auto", "simple rule")],
            full_rounds=FULL_ROUNDS,
            min_rounds=5,  # a bootstrap over 5 rounds has 126 distinct resamples
            max_rounds=max_rounds,
            deadline=deadline,
        )
    finally:
        auto.close()
    return format_evaluation(result)
