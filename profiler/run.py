"""A profiling run: plan the configs still to do, measure them in a worker, write each as soon as
it is finished (and publish it to the tracking server: store/fleet.py), show progress, then
summarise and log the run to MLflow."""

from __future__ import annotations

import collections
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from chunkpilot.clock import clock
from chunkpilot.contract import ConfigError
from store.dataset import LISTS, contended, finished_keys, write_config
from store.fleet import HARDWARE_TAG, PROFILING_EXPERIMENT, SPEC_TAG, Publisher

from .plan import TimeModel, config_cost, known_shape, space_filling_order
from .spec import ProfileConfig, Spec
from .worker import Worker, WorkerError


def describe(config: ProfileConfig) -> str:
    window = "none" if config.window is None else f"{config.window}{config.layout[0]}"
    return (
        f"{Path(config.model).stem} n={config.context_length} w={window} s={config.sinks} "
        f"{config.dtype} t{config.threads} {config.attn_impl}{f' {config.quant}' if config.quant else ''}"
    )


@dataclass
class RunReport:
    directory: Path  # this machine's folder of the spec
    measured: list[str] = field(default_factory=list)  # config keys finished by this run
    already_done: int = 0
    over_budget: int = 0
    failed: list[str] = field(default_factory=list)  # configs whose measuring crashed; rerun retries them
    skipped_candidates: collections.Counter = field(default_factory=collections.Counter)
    seconds: float = 0.0
    interrupted: bool = False


def machine_dir(out: Path, spec: Spec) -> Path:
    """Where this machine's files of the spec go: each machine measures every config itself."""
    from engine.machine import fingerprint

    return out / spec.name / fingerprint(spec.device)["hardware_id"]


def open_run(spec: Spec, out: Path) -> Publisher:
    """The spec's `profiling` run on this machine, opened before measuring so that each finished
    config is published as soon as it is written."""
    from store.tracking import quiet_mlflow, tracking_uri

    hardware_id = machine_dir(out, spec).name
    with quiet_mlflow():
        tags = {HARDWARE_TAG: hardware_id, SPEC_TAG: spec.name}
        return Publisher.open(tracking_uri(), PROFILING_EXPERIMENT, spec.name, tags)


def run_profile(
    spec: Spec, out: Path, budget_minutes: float | None = None, publisher: Publisher | None = None
) -> RunReport:
    directory = machine_dir(out, spec)
    report = RunReport(directory)
    done = finished_keys(directory)
    if publisher is not None and (caught_up := publisher.catch_up(directory, spec.name)):
        print(f"published {caught_up} finished configs that no run had published yet", file=sys.stderr)
    shapes = {m: known_shape(m) for m in dict.fromkeys(c.model for c in spec.configs)}
    plan: list[ProfileConfig] = []
    chunks: dict[ProfileConfig, list[int]] = {}
    ordered = space_filling_order(list(spec.configs)) if spec.order == "space-filling" else list(spec.configs)
    for config in ordered:
        chunks[config], reasons = config.candidates(spec.chunk_sizes)
        report.skipped_candidates.update(r.split(": ", 1)[1].split(" (")[0] for r in reasons)
        if config.key in done:
            report.already_done += 1
        else:
            plan.append(config)
    passes = spec.warmup + spec.repeats
    costs = {c: config_cost(c, shapes[c.model], chunks[c], passes) for c in plan}
    times = TimeModel(spec.device)
    start = time.monotonic()
    # wall-clock: the worker process reads the same deadline to bound its re-measures
    deadline = None if budget_minutes is None else time.time() + 60 * budget_minutes
    print(
        f"profile {spec.name}: {len(spec.configs)} configs, {report.already_done} already done, "
        f"{len(plan)} to measure -> {directory}",
        file=sys.stderr,
    )
    if report.skipped_candidates:
        reasons = ", ".join(f"{n} {why}" for why, n in report.skipped_candidates.items())
        print(f"infeasible chunk sizes skipped: {reasons}", file=sys.stderr)
    with Worker(spec, out.parent / "hardware") as worker:
        try:
            for i, config in enumerate(plan):
                if deadline is not None and time.time() + times.seconds(config, costs[config]) > deadline:
                    report.over_budget += 1  # a cheaper config later in the plan may still fit
                    continue
                t0 = time.monotonic()
                try:
                    rows = worker.measure(config, deadline)
                # one crashed config (out of memory, say) or one this machine cannot run (a llama.cpp
                # quantisation its probe refused) must not end the sweep
                except (WorkerError, ConfigError) as exc:
                    report.failed.append(config.key)
                    print(
                        f"[{i + 1:>4}/{len(plan)}] {describe(config)}: FAILED, will be retried by a rerun: {exc}",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                written = write_config(directory, config.key, rows)
                if publisher is not None and not publisher.publish(written):
                    publisher = None  # the server is gone: measure on, the spec's next run publishes the rest
                    print("publishing stops for this run; its next run publishes what is left", file=sys.stderr)
                seconds = time.monotonic() - t0
                times.learn(config, costs[config], seconds)
                report.measured.append(config.key)
                elapsed = time.monotonic() - start
                remaining = sum(times.seconds(c, costs[c]) for c in plan[i + 1 :])
                if deadline is not None:
                    remaining = min(remaining, max(deadline - time.time(), 0))
                best = rows.loc[rows.ttft_ms.idxmin()]
                print(
                    f"[{i + 1:>4}/{len(plan)} {100 * (i + 1) / len(plan):3.0f}%] {clock(elapsed)} elapsed, "
                    f"ETA {clock(remaining)} | {describe(config)}: best {best.chunk_size} of {len(rows)} "
                    f"({best.ttft_ms:.1f} ms, cv {statistics.median(rows.ttft_cv):.0%})"
                    + (" NOISY" if rows.noisy.iloc[0] else "")
                    + (
                        f" BESIDE OTHER WORK ({rows.foreign_cores.iloc[0]:.2f} cores): left out of training"
                        if contended(rows).iloc[0]
                        else ""
                    ),
                    file=sys.stderr,
                    flush=True,
                )
        except KeyboardInterrupt:
            report.interrupted = True
    report.seconds = time.monotonic() - start
    return report


def log_run(
    publisher: Publisher, spec: Spec, report: RunReport, dataset: pd.DataFrame, budget_minutes: float | None
) -> str:
    """Close the run: the spec, what was measured, the dataset as its input."""
    import mlflow

    from store.tracking import log_input, quiet_mlflow, tracking_uri

    measured = dataset[dataset.config_key.isin(report.measured)]
    mlflow.set_tracking_uri(tracking_uri())
    with quiet_mlflow(), mlflow.start_run(run_id=publisher.run_id) as run:
        mlflow.log_params(
            {
                "spec": spec.name,
                "configs_in_spec": len(spec.configs),
                "repeats": spec.repeats,
                "warmup": spec.warmup,
                "cv_threshold": spec.cv_threshold,
                "max_remeasure": spec.max_remeasure,
                "chunk_sizes": ",".join(map(str, spec.chunk_sizes)),
                "budget_minutes": budget_minutes,
                "models": ",".join(dict.fromkeys(c.model for c in spec.configs))[:500],
            }
        )
        mlflow.log_metrics(
            {
                "configs_measured": len(report.measured),
                "configs_already_done": report.already_done,
                "configs_over_budget": report.over_budget,
                "rows_written": len(measured),
                "rows_in_dataset": len(dataset),
                "duration_s": report.seconds,
                "interrupted": float(report.interrupted),
                "median_cv": float(dataset.ttft_cv.median()),
                "noisy_configs": int(dataset.groupby("config_key").noisy.first().sum()),
            }
        )
        mlflow.log_dict(spec.model_dump(mode="json"), "spec.yaml")
        lineage = dataset.drop(columns=LISTS)
        log_input(mlflow.data.from_pandas(lineage, source=str(report.directory), name=spec.name), "profiling")
        return run.info.run_id
