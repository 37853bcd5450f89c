"""`chunkpilot train`: the model and its baselines on the profiled dataset, logged to MLflow."""

from __future__ import annotations

import argparse
from pathlib import Path

from chunkpilot.config import ConfigError, check_int

HELP = "train the chunk-size model, log it and its baselines to MLflow, register a champion"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=Path("data/ttft"), help="dataset root (default data/ttft)")
    parser.add_argument("--experiment", default="chunk-size", help="MLflow experiment")
    parser.add_argument("--n-estimators", help="LightGBM trees (default 400)")
    parser.add_argument("--num-leaves", help="LightGBM leaves per tree (default 31)")
    parser.add_argument("--learning-rate", help="LightGBM learning rate (default 0.05)")


def run(args: argparse.Namespace) -> int:
    params: dict = {}
    if args.n_estimators is not None:
        params["num_boost_round"] = check_int("n_estimators", args.n_estimators, 1, 100_000)
    if args.num_leaves is not None:
        params["num_leaves"] = check_int("num_leaves", args.num_leaves, 2, 100_000)
    if args.learning_rate is not None:
        try:
            rate = float(args.learning_rate)
        except ValueError:
            rate = -1.0
        if not 0 < rate <= 1:
            raise ConfigError("learning_rate", f"must be a number in (0, 1]; got {args.learning_rate!r}")
        params["learning_rate"] = rate

    from .train import format_result, train

    print(format_result(train(args.data, args.experiment, params)))
    return 0
