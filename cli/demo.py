"""`chunkpilot demo`, the main job end to end: profile this machine briefly, train and register
(through the promotion gate), serve the champion, let it learn this machine from a short workload
of its own prefills (telemetry on, bounded exploration), then race `auto` against the lineup (one
shot, the engine's default, this machine's best single size from its own profile rows, the hand
rule, the simple rule, fixed 1024: judge.lineup) on prompts drawn afresh from a seeded
generator whose lengths and windows no profile or learning prompt of the model holds
(evaluation/prompts.py), with the evaluator (evaluation/comparison.py): TTFT and regret per prompt
and policy, and auto's saving over each, the strongest first, gross, warm and cold (its first
decisions of kinds the service never saw, and the decision tables they built on these cores), with
95% intervals. The comparison's own measurements never reach the model (it measures fixed sizes;
auto is only asked). Every run appends its record to results/ (evaluation/records.py)."""

from __future__ import annotations

import argparse
import os
import secrets
import time
from pathlib import Path

from chunkpilot.contract import AttentionConfig, number
from chunkpilot.paths import DATA_ROOT, SPECS_DIR
from engine.workload import Workload
from evaluation.prompts import Seen, draw_prompts
from evaluation.records import append_record, race_record
from predictor.settings import Settings

from .fields import add_fields, build, values
from .processes import free_port, start_service, wait_ready

HELP = "the main job: profile briefly, train, serve, learn from prefills, race auto against the strongest baselines"
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
    parser.add_argument("--seed", help="the race prompts' seed (default: drawn now, printed and recorded)")
    add_fields(parser, Settings, SERVICE_FLAGS)


STEPS = 6
FULL_ROUNDS = 2  # comparison rounds that time every size (the race for the best), before only the compared
STOP_S = 10  # what the demo does after the comparison: stop the service, print


def _step(n: int, text: str, start: float) -> None:
    print(f"\n[{n}/{STEPS} at {time.monotonic() - start:.0f} s] {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    import httpx

    from evaluation.comparison import format_evaluation
    from profiler.run import log_run, open_run, run_profile
    from profiler.spec import Spec
    from store.dataset import read_dataset
    from training.train import train_and_report

    minutes = number("profile_minutes", args.profile_minutes, float, gt=0, le=60)
    max_rounds = number("max_rounds", args.max_rounds, int, ge=1, le=200)
    budget = number("minutes", args.minutes, float, gt=0, le=120)
    seed = number("seed", args.seed, int, ge=0, le=2**31 - 1) if args.seed is not None else secrets.randbelow(2**31)
    explore = build(Settings, **values(args, SERVICE_FLAGS)).explore_budget
    start = time.monotonic()
    spec = Spec.from_file(args.spec)
    prompts = draw_prompts(seed, seen(args.model, spec, args.data))
    print(f"race prompts drawn from seed {seed}: {'; '.join(w.label for w in prompts)}", flush=True)
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

    from engine.config import EngineConfig
    from engine.engine import Engine

    # this machine's descriptors into the engine's cache while nothing else runs: the service's first
    # minutes compile its forests on a core, and a machine measured beside them reads slow
    Engine(EngineConfig(model=args.model)).hardware()
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
            f"its telemetry); {args.model}: {len(prompts)} prompts drawn from seed {seed}, every chunk size (each "
            f"policy's choice among them) for {min(FULL_ROUNDS, max_rounds)} rounds, then only the sizes still "
            f"compared, rounds while they fit in {budget:g} min ({min(5, max_rounds)} to {max_rounds})",
            start,
        )
        result = compare_with_service(
            args.model, url, max_rounds, prompts, args.data, deadline=start + budget * 60 - STOP_S
        )
    finally:
        service.terminate()
        service.wait(timeout=20)
    _step(6, "stopped the service", start)
    print(format_evaluation(result))
    where = append_record(race_record(result, "make demo", seed, "chunkpilot", args.model))
    print(f"\nrecorded in {where} (docs/results.md: .venv/bin/chunkpilot results)")
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

    from auto.client import make_auto
    from auto.telemetry import Reporter, to_service
    from engine.config import EngineConfig
    from engine.engine import Engine

    engine = Engine(EngineConfig(model=model))
    reporter = Reporter(to_service(url), capacity=4096)
    auto = make_auto(engine.hardware(), service=url, timeout_s=0.5, reporter=reporter)
    # the forests compile once per machine and model, minutes of one core: not beside the prefills
    forests = auto.forests_ready()
    explored = 0
    try:
        for k in range(passes):
            for workload in workloads:  # other words each pass
                explored += engine.run(dataclasses.replace(workload, seed=k + 1), auto).decision.explored
    finally:
        auto.close()  # flushes the telemetry
    learnt = httpx.get(f"{url}/v1/model").json().get("learnt_from_prefills", 0)
    compiled = forests.get("forests_compile_s")
    return (
        f"learning from {reporter.sent} prefills ({explored} explored a candidate other than the recipe's "
        f"choice, {reporter.dropped} dropped): the service's correction now holds {learnt} prefills of this "
        "machine"
    ) + (
        ""
        if compiled is None
        else f" (first its forests compiled, {compiled:.0f} s of one core, once per machine and model)"
    )


def seen(model: str, spec, data: Path) -> Seen:
    """What `model` was profiled or taught on: the demo's grid, the learning workload and every row
    of it under `data` (the shipped data and earlier demos)."""
    from store.dataset import read_dataset

    rows = read_dataset(data)
    mine = rows[rows.model == model]
    return (
        Seen.of((c.context_length, c.window) for c in spec.configs if c.model == model)
        | Seen.of((w.context_length, w.attention.window) for w in LEARN)
        | Seen.of(zip(mine.context_length.tolist(), mine.window.tolist(), strict=True))
    )


def compare_with_service(
    model: str,
    url: str,
    max_rounds: int,
    workloads: list[Workload],
    data: Path,
    deadline: float | None = None,
    full_rounds: int = FULL_ROUNDS,
):
    """The demo's race: `auto` asking the service against the lineup (this machine's best single
    size from its rows under `data`), measured by the one evaluator (evaluation/comparison.py)
    until the savings are settled, `deadline` passes or `max_rounds` do. The service's forests are
    ready first (compiled once per machine and model, minutes of one core that would slow every
    policy's prefills unevenly); nothing else is built before the first decisions: auto's cold cost
    is what a service that never saw these kinds answers (their cells built in those requests), plus
    the table builds those answers left to the background on these cores."""
    import httpx

    from auto.client import ask, make_auto
    from engine.config import EngineConfig
    from engine.engine import Engine
    from evaluation.comparison import evaluate
    from evaluation.lineup import baseline_policies, charge_table_builds, machine_best

    engine = Engine(EngineConfig(model=model))
    hardware = engine.hardware()
    auto = make_auto(hardware, service=url)
    auto.forests_ready()  # read from the cache the learning step's service filled: nothing compiles in the race
    baselines = baseline_policies(engine.backend, machine_best(data, engine))
    policies = {"auto": auto, **baselines}

    def tables() -> tuple[int, int, float]:
        said = httpx.get(f"{url}/v1/model", timeout=5).json()["decision_table"]
        return said["kinds"], said["kinds_built"], said["build_s_total"]

    def kind_of(p) -> str:
        return ask(engine.request(p.case.context_length, p.case.attention), hardware).kind()

    try:
        return evaluate(
            engine,
            policies,
            workloads,
            [("auto", name) for name in baselines],
            full_rounds=full_rounds,
            min_rounds=5,  # a bootstrap over 5 rounds has 126 distinct resamples
            max_rounds=max_rounds,
            deadline=deadline,
            after_first=charge_table_builds(kind_of, tables),
        )
    finally:
        auto.close()
