"""`chunkpilot retrain`: train on everything under the data root (the shipped data, any profiles
and the engine's telemetry), or with --from-tracking on what the fleet published to the tracking
server, and pass the gate, which also judges the engine's recent prefills;
once, or every N minutes unattended. A failed or worse retrain leaves the champion serving and says
why (the run's tags, the registered model's `last_retrain` tag, the service's /readyz)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from chunkpilot.contract import number
from chunkpilot.paths import DATA_ROOT

from .options import add_training_args, compare, lgbm_params

HELP = "retrain on the shipped data, profiles and telemetry, and promote through the gate (once or every N min)"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="dataset root (telemetry included)")
    parser.add_argument("--experiment", default="chunk-size", help="MLflow experiment")
    parser.add_argument("--every", help="minutes between retrains (default: retrain once)")
    parser.add_argument(
        "--from-tracking",
        action="store_true",
        help="train on what the fleet published to the tracking server instead of --data's files",
    )
    add_training_args(parser)


def run(args: argparse.Namespace) -> int:
    every = None if args.every is None else number("every", args.every, float, gt=0, le=7 * 24 * 60)
    params, judged_beside = lgbm_params(args), compare(args)

    from mlflow import MlflowClient

    from store import registry
    from store.tracking import quiet_mlflow, tracking_uri
    from training.train import train_and_report

    while True:
        started = time.monotonic()
        try:
            print(
                train_and_report(
                    None if args.from_tracking else args.data, args.experiment, params, compare=judged_beside
                ),
                flush=True,
            )
        except Exception as exc:  # the champion keeps serving; say why where the service shows it
            reason = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"chunkpilot retrain: {reason}", flush=True)
            with quiet_mlflow():
                registry.record_retrain(MlflowClient(tracking_uri=tracking_uri()), reason)
            if every is None:
                raise
        if every is None:
            return 0
        time.sleep(max(0.0, every * 60 - (time.monotonic() - started)))
