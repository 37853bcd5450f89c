"""Does the loop learn? A champion trained without this machine's rows serves a mixed workload
through the engine's `auto` (telemetry on, bounded exploration): the service's correction learns
this machine from each prefill at once, and `chunkpilot retrain`'s training runs between rounds.
After each round the served recipe (the champion with the correction learnt from the telemetry so
far, as the service loads it) is scored on a fixed probe set of this machine against the lineup of
baselines (judge.lineup: one shot, the engine's default, this machine's best single size where
its shipped profile has rows, the hand rule, the simple rule, fixed 1024), the strongest of them on
the probe set named, and a reference model trained with this machine's full shipped profile (the
same as the champion where the shipped data has no rows of this machine).

The probe set is measured once, before the rounds, the evaluator's way: every feasible chunk size
of every probe prompt, interleaved and rotated over `--probe-rounds` rounds after a warm-up; a
policy's regret is the median TTFT of the size it picks over the best size's, and its interval a
bootstrap over those rounds. Scoring a champion costs no further measurement, so every round's
champion is judged on the very same times.

    .venv/bin/python bench/closed_loop.py [--rounds 3] [--prefills 80] [--explore 0.01] [--probe-rounds 5]
        [--plot docs/closed_loop.png]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from mlflow import MlflowClient

from auto.client import AutoPolicy, InProcessPolicy, make_auto
from auto.telemetry import Reporter, to_service
from chunkpilot.chunks import landed
from chunkpilot.contract import AttentionConfig
from chunkpilot.paths import SHIPPED_DIR
from cli.processes import free_port, start_service, wait_ready
from engine.config import EngineConfig
from engine.engine import Engine
from engine.machine import fingerprint
from engine.policy import BaselinePolicy, ChunkPolicy
from engine.workload import Workload
from evaluation.lineup import machine_best
from evaluation.rounds import time_sizes, timed
from judge.lineup import lineup
from judge.regret import Choices, Times, regret, regret_gap, regret_of
from predictor.model import past_outcomes
from store.registry import CHAMPION, MODEL_NAME
from training.train import format_result, train

SHAPE_FILE = "data/shapes/wide-shallow.yaml"
MODELS = ["llama-tiny", "qwen2-gqa", SHAPE_FILE]
# (model, prompt): this deployment's kinds of prompt, none of them a profiled config; the workload
# draws from them and the probe set is them, so the score is on the user's own prompts
PROBES = [
    ("llama-tiny", Workload(800)),
    ("llama-tiny", Workload(3000, AttentionConfig(1024))),
    ("llama-tiny", Workload(6000, AttentionConfig(512, "ring"))),
    ("llama-tiny", Workload(12000, AttentionConfig(2048))),
    ("qwen2-gqa", Workload(1500)),
    ("qwen2-gqa", Workload(4000, AttentionConfig(1024, "ring"))),
    ("qwen2-gqa", Workload(6000, AttentionConfig(2048))),
    (SHAPE_FILE, Workload(500)),
    (SHAPE_FILE, Workload(2500, AttentionConfig(512))),
    (SHAPE_FILE, Workload(5000, AttentionConfig(1024, "ring"))),
]


def train_into(store: Path, data: Path, table: bool = False) -> tuple[str, str]:
    """`chunkpilot train` on `data` into the MLflow store at `store` (with every baseline and
    printing its table, if asked); returns (what the gate did, the champion's version after it)."""
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    cwd = os.getcwd()
    os.chdir(store)  # artifacts under store/mlruns
    try:
        result = train(data, compare="all" if table else "recipes")
    finally:
        os.chdir(cwd)
    if table:
        print(format_result(result), flush=True)
    said = f"v{result.version} {result.verdict.alias}: {result.verdict.reason}"
    champion = MlflowClient().get_model_version_by_alias(MODEL_NAME, CHAMPION).version
    return (f"{result.settled}; {said}" if result.settled else said), str(champion)


def measure_probes(engines: dict[str, Engine], rounds: int) -> Times:
    """probe index -> chunk size -> TTFT ms over the rounds."""
    times = {}
    for i, (model, workload) in enumerate(PROBES):
        times[i] = time_sizes(engines[model], workload, rounds)
        print(f"  probe {i + 1}/{len(PROBES)} {model} {workload.label}: {len(times[i])} sizes", flush=True)
    return times


def probe_times(engines: dict[str, Engine], rounds: int, machine: str, path: Path) -> Times:
    """The probe set's times: measured once per machine and kept in `path` (a rerun skips ~10 min)."""
    key = {"machine": machine, "probes": [(m, w.label) for m, w in PROBES], "rounds": rounds}
    if path.is_file() and (kept := json.loads(path.read_text()))["key"] == json.loads(json.dumps(key)):
        print(f"probe set: times of this machine from {path}", flush=True)
        return {int(i): {int(c): v for c, v in sizes.items()} for i, sizes in kept["times"].items()}
    print(f"measuring the probe set ({len(PROBES)} prompts, every size, {rounds} rounds)", flush=True)
    times = measure_probes(engines, rounds)
    path.write_text(json.dumps({"key": key, "times": times}))
    return times


def served_auto(uri: str, hardware, telemetry: Path | None = None) -> tuple[InProcessPolicy, int]:
    """(`auto` in-process on the champion of `uri`, corrected by the outcomes in `telemetry` as the
    service loads it, with its forests compiled; the prefills its correction learnt from): asked
    about each probe as the engine asks it, its first decision timed (no HTTP: the in-process cost)."""
    policy = InProcessPolicy(uri, hardware)
    if policy.predictor.forests is not None:  # compiled once per machine and model (predictor_latency.py)
        policy.predictor.forests.join()
    learnt = policy.predictor.learn(past_outcomes(telemetry).outcomes) if telemetry is not None else 0
    return policy, learnt


def serve_workload(engines: dict[str, Engine], policy: AutoPolicy, count: int, rng: random.Random) -> float:
    """`count` prefills drawn from the deployment's kinds of prompt; returns their total TTFT in ms."""
    total = 0.0
    for _ in range(count):
        model, workload = rng.choice(PROBES)
        other_words = Workload(workload.context_length, workload.attention, seed=rng.randrange(1000))
        total += engines[model].run(other_words, policy).ttft_ms
    return total


def choices_table(times: Times, policies: dict[str, dict[int, int]]) -> str:
    """Per probe: the best size, and each policy's size with its regret (medians over the probe rounds)."""
    lines = ["\nper probe: the measured best size; each policy's size and its regret against it"]
    width = {name: max(14, len(name) + 2) for name in policies}
    lines.append(f"{'probe':<32}{'best':>6}" + "".join(f"{name:>{width[name]}}" for name in policies))
    for i, (model, workload) in enumerate(PROBES):
        med = {c: float(np.median(v)) for c, v in times[i].items()}
        best = min(med, key=med.get)
        label = f"{Path(model).stem} {workload.label}"
        cells = "".join(f"{f'{c[i]} {regret_of(med, c[i]):+.1%}':>{width[n]}}" for n, c in policies.items())
        lines.append(f"{label:<32}{best:>6}{cells}")
    return "\n".join(lines)


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefills", type=int, default=80, help="workload prefills per round")
    parser.add_argument("--explore", type=float, default=0.01, help="the service's exploration budget")
    # a bootstrap over 3 rounds has only 10 distinct resamples: 5 make an interval worth stating
    parser.add_argument("--probe-rounds", type=int, default=5)
    parser.add_argument("--plot", type=Path, help="write the regret per round as a PNG")
    parser.add_argument(
        "--probe-times",
        type=Path,
        default=Path(tempfile.gettempdir()) / "chunkpilot-probe-times.json",
        help="where this machine's probe times are kept between runs",
    )
    args = parser.parse_args()
    for name, value, low, high in (
        ("--rounds", args.rounds, 1, 20),
        ("--prefills", args.prefills, 1, 10_000),
        ("--explore", args.explore, 0.0, 0.5),
        ("--probe-rounds", args.probe_rounds, 2, 50),
    ):
        if not low <= value <= high:
            parser.error(f"{name} must be between {low} and {high} (got {value})")
    start = time.monotonic()
    machine = fingerprint()["hardware_id"]
    work = Path(tempfile.mkdtemp(prefix="chunkpilot-loop-"))
    data = work / "data"
    for folder in SHIPPED_DIR.iterdir():  # the shipped data without this machine's rows
        if folder.name != machine:
            shutil.copytree(folder, data / "shipped" / folder.name)
    print(
        f"machine {machine}; champion trained on {', '.join(p.name for p in (data / 'shipped').iterdir())}; "
        f"reference on all of {SHIPPED_DIR}; work in {work}",
        flush=True,
    )
    (work / "store").mkdir()
    (work / "reference").mkdir()
    print("training the champion (v1) and the reference", flush=True)
    train_into(work / "store", data, table=True)
    store_uri = f"sqlite:///{work / 'store' / 'mlflow.db'}"
    reference_uri = store_uri  # this machine has no shipped rows: the reference is the champion
    if (SHIPPED_DIR / machine).is_dir():
        train_into(work / "reference", SHIPPED_DIR.resolve())
        reference_uri = f"sqlite:///{work / 'reference' / 'mlflow.db'}"

    engines = {m: Engine(EngineConfig(model=m)) for m in MODELS}
    hardware = engines[MODELS[0]].hardware()
    times = probe_times(engines, args.probe_rounds, machine, args.probe_times)

    def by(policy: ChunkPolicy) -> Choices:  # each probe asked as the engine asks it, timed
        def decide(i: int) -> int:
            model, workload = PROBES[i]
            decision = policy.decide(engines[model].request(workload.context_length, workload.attention))
            if decision.source == "fallback":  # a champion that cannot answer is not scored as its anchor
                raise SystemExit(f"{policy.name} fell back on probe {i}: {decision.reason}")
            return landed(times[i], decision.chunk_size)  # the measured size it runs as

        choices = timed(decide, probes)
        policy.close()
        return choices

    probes = range(len(PROBES))
    best = machine_best(SHIPPED_DIR, engines[MODELS[0]])  # None where the shipped data has no rows of it
    baselines = {b.name: by(BaselinePolicy(b)) for b in lineup(engines[MODELS[0]].backend, best)}
    scores = {name: regret(times, choices) for name, choices in baselines.items()}
    strongest = min(scores, key=lambda name: scores[name][0])
    reference = regret(times, by(served_auto(reference_uri, hardware)[0]))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = start_service(
        port, tracking_uri=store_uri, poll_interval_s=1, explore_budget=args.explore, telemetry_dir=data / "telemetry"
    )
    rows = []
    rng = random.Random(0)
    try:
        wait_ready(url, service)
        for k in range(args.rounds + 1):
            champion = httpx.get(f"{url}/readyz").json()["version"]
            policy, learnt = served_auto(store_uri, hardware, data / "telemetry")
            choices = by(policy)
            row = {
                "round": k,
                "version": champion,
                "champion": regret(times, choices),
                "learnt": learnt,
                "choices": choices,
            }
            if k == args.rounds:
                rows.append(row)
                break
            reporter = Reporter(to_service(url), capacity=4096)
            policy = make_auto(hardware, service=url, timeout_s=0.5, reporter=reporter)
            served = serve_workload(engines, policy, args.prefills, rng)
            policy.close()
            metrics = httpx.get(f"{url}/metrics").text
            row |= {
                "served_s": served / 1e3,
                "sent": policy.reporter.sent,
                "dropped": policy.reporter.dropped,
                "accepted": metric(metrics, 'chunkpilot_outcomes_total{result="accepted"}'),
                "rejected": metric(metrics, 'chunkpilot_outcomes_total{result="rejected"}'),
                "explored": metric(metrics, "chunkpilot_explored_total"),
                "share": metric(metrics, "chunkpilot_explore_spent_share"),
            }
            row["verdict"], serving = train_into(work / "store", data)
            rows.append(row)
            deadline = time.monotonic() + 30  # the service's alias poll picks a promotion up
            while time.monotonic() < deadline and httpx.get(f"{url}/readyz").json()["version"] != serving:
                time.sleep(0.5)
            print(f"round {k + 1}: {row['verdict']}", flush=True)
    finally:
        service.terminate()
        service.wait(timeout=20)

    print(f"\nprobe set: {len(PROBES)} prompts on this machine, mean regret vs the measured best [95% interval]")
    for name, (mean, low, high) in scores.items():
        mark = "  <- the strongest" if name == strongest else ""
        print(f"{name:<44}{mean:>7.1%} [{low:.1%}, {high:.1%}]{mark}")
    print(
        f"{'reference':<44}{reference[0]:>7.1%} [{reference[1]:.1%}, {reference[2]:.1%}]  (trained with this "
        "machine's full shipped profile)"
    )
    print(
        f"\n{'round':<6}{'champion':>9}{'learnt':>8}{'regret':>8}{'interval':>18}{'prefills':>9}{'accepted':>9}"
        f"{'dropped':>8}{'rejected':>9}{'explored':>9}{'explore share':>14}"
    )
    for r in rows:
        mean, low, high = r["champion"]
        line = f"{r['round']:<6}{'v' + r['version']:>9}{r['learnt']:>8}{mean:>8.1%}{f'[{low:.1%}, {high:.1%}]':>18}"
        if "sent" in r:
            line += (
                f"{args.prefills:>9}{r['accepted']:>9.0f}{r['dropped']:>8}{r['rejected']:>9.0f}"
                f"{r['explored']:>9.0f}{r['share']:>14.2%}"
            )
        print(line)
    last = rows[-1]["choices"]
    policies = {**baselines, "round 0": rows[0]["choices"], "last": last}
    print(choices_table(times, {name: sizes for name, (sizes, _) in policies.items()}))
    print(
        f"first decision, median over the probes: the served recipe {np.median(list(last[1].values())):.3f} ms, "
        f"the strongest baseline {np.median(list(baselines[strongest][1].values())):.4f} ms"
    )
    for name, theirs in (*baselines.items(), ("the served recipe at round 0", rows[0]["choices"])):
        gross, net = regret_gap(times, last, theirs), regret_gap(times, last, theirs, net=True)
        named = f"{name} (the strongest)" if name == strongest else name
        print(
            f"round {rows[-1]['round']} minus {named}: {gross[0]:+.1%} of mean regret [95% interval "
            f"{gross[1]:+.1%}, {gross[2]:+.1%}]; net of each one's first decision {net[0]:+.1%} "
            f"[{net[1]:+.1%}, {net[2]:+.1%}]"
        )
    print(
        f"(round r: the champion after r retrains with its correction learnt from the `learnt` prefills of the "
        "telemetry so far, scored before round r's workload; "
        f"{(time.monotonic() - start) / 60:.1f} min in all)"
    )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ks = [r["round"] for r in rows]
        ax.errorbar(
            ks,
            [r["champion"][0] for r in rows],
            yerr=np.array([[r["champion"][0] - r["champion"][1], r["champion"][2] - r["champion"][0]] for r in rows]).T,
            marker="o",
            label="served recipe (champion + this machine's correction)",
            capsize=3,
        )
        lines = [(name, score[0], f"C{k + 1}") for k, (name, score) in enumerate(scores.items())]
        lines.append(("reference (full local profile)", reference[0], f"C{len(lines) + 1}"))
        for label, value, color in lines:
            ax.axhline(value, linestyle="--", linewidth=1, label=label, color=color)
        ax.set_xticks(ks)
        ax.set_xlabel(f"rounds of {args.prefills} prefills (a retrain after each)")
        ax.set_ylabel("mean regret on the probe set")
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
