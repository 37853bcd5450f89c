"""`chunkpilot profile`: sweep a spec through the engine into data/ttft/, or check that finished
configs reproduce in a fresh process."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from chunkpilot.contract import number
from chunkpilot.paths import DATA_ROOT

if TYPE_CHECKING:
    from profiler.spec import Spec
    from store.fleet import Publisher

T = TypeVar("T")
HELP = "measure TTFT for every chunk size over a spec's configs (resumable)"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="YAML spec (see data/specs/)")
    parser.add_argument("--out", type=Path, default=DATA_ROOT, help=f"dataset root (default {DATA_ROOT})")
    parser.add_argument("--budget-minutes", help="space-filling subset that fits this many minutes")
    parser.add_argument(
        "--check-repro", action="store_true", help="re-measure a sample of finished configs in a fresh process"
    )
    parser.add_argument("--sample", default="10", help="configs re-measured by --check-repro")
    parser.add_argument(
        "--no-mlflow", action="store_true", help="do not log the run (nor publish its configs) to MLflow"
    )


def run(args: argparse.Namespace) -> int:
    from profiler.spec import Spec

    spec = Spec.from_file(args.spec)
    budget = (
        None
        if args.budget_minutes is None
        else number("budget_minutes", args.budget_minutes, float, gt=0, le=7 * 24 * 60)
    )
    if args.check_repro:
        from profiler.repro import check_reproducibility, format_repro

        result = check_reproducibility(spec, args.out, number("sample", args.sample, int, ge=1, le=10_000))
        print(format_repro(result))
        return 0

    from profiler.run import log_run, run_profile
    from profiler.summary import format_summary, summarize_configs
    from store.dataset import read_dataset

    publisher = None if args.no_mlflow else _tracked(lambda: _open(spec, args.out), "opening a profiling run")
    report = run_profile(spec, args.out, budget, publisher)
    if not report.measured and not report.already_done:
        print("nothing measured yet", file=sys.stderr)
        if publisher is not None:
            status = "KILLED" if report.interrupted else "FINISHED"
            _tracked(lambda: publisher.client.set_terminated(publisher.run_id, status), "closing the profiling run")
        return 130 if report.interrupted else 0
    dataset = read_dataset(report.directory)  # this machine's rows: another's share the config keys
    print(format_summary(summarize_configs(dataset)))
    print(
        f"{len(report.measured)} configs measured in {report.seconds / 60:.1f} min, {report.already_done} were done, "
        f"{report.over_budget} left out by the budget, {len(report.failed)} failed; "
        f"dataset: {len(dataset)} rows in {report.directory}"
    )
    if publisher is not None and (
        run_id := _tracked(lambda: log_run(publisher, spec, report, dataset, budget), "closing the profiling run")
    ):
        print(f"logged to MLflow experiment 'profiling', run {run_id}, each finished config as an artifact")
    if report.interrupted:
        print("interrupted: finished configs are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    return 1 if report.failed else 0


def _open(spec: Spec, out: Path) -> Publisher:
    """The profiling run, once the tracking server answers (MLflow's own retries take minutes)."""
    from cli.processes import answers
    from profiler.run import open_run
    from store.tracking import tracking_uri

    uri = tracking_uri()
    if uri.startswith(("http://", "https://")) and not answers(f"{uri.rstrip('/')}/health"):
        raise ConnectionError("it does not answer GET /health")
    return open_run(spec, out)


def _tracked(call: Callable[[], T], what: str) -> T | None:
    """The tracking server's part of a profile: if it fails, say so in one line and go on, since the
    files on disk are the record (the spec's next run publishes what no run has listed)."""
    from store.tracking import tracking_uri

    try:
        return call()
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"chunkpilot profile: {what} on {tracking_uri()} failed ({type(exc).__name__}: {reason[:200]}); "
            "the measured configs stay on disk and the spec's next run publishes them",
            file=sys.stderr,
        )
        return None
