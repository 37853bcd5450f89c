"""`chunkpilot train`: the model and its baselines on the profiled dataset, logged to MLflow."""

from __future__ import annotations

import argparse
from pathlib import Path

from chunkpilot.contract import ConfigError, number
from chunkpilot.paths import DATA_ROOT

from .options import add_training_args, compare, lgbm_params

HELP = "train the chunk-size model, log it and its baselines to MLflow, register a champion"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help=f"dataset root (default {DATA_ROOT})")
    parser.add_argument(
        "--from-tracking",
        action="store_true",
        help="train on what every machine published to the tracking server (MLFLOW_TRACKING_URI): "
        "profiled configs and telemetry batches, instead of --data's files",
    )
    parser.add_argument("--experiment", default="chunk-size", help="MLflow experiment")
    parser.add_argument("--search-minutes", help="budget of a random hyperparameter search (default: no search)")
    parser.add_argument("--recipe", help="the recipe to register (estimator.recipe.RECIPES; default: DEFAULT)")
    parser.add_argument(
        "--older-engines",
        action="store_true",
        help="keep the rows measured by code of their kernel that no longer runs (left out by default)",
    )
    add_training_args(parser)


def run(args: argparse.Namespace) -> int:
    params = lgbm_params(args)
    search_minutes = (
        0.0 if args.search_minutes is None else number("search_minutes", args.search_minutes, float, gt=0, le=24 * 60)
    )

    from estimator.recipe import DEFAULT, RECIPES

    recipe = args.recipe or DEFAULT
    if recipe not in RECIPES:
        raise ConfigError("recipe", f"must be one of {', '.join(RECIPES)}; got {recipe!r}")

    import shlex
    import sys

    from evaluation.records import append_record, train_record
    from training.baselines import LINEUP
    from training.train import TrainResult, train_and_report

    def record(result: TrainResult) -> None:  # the held-out table, for docs/results.md and the README
        command = shlex.join(["chunkpilot", *sys.argv[1:]]) if sys.argv[1:2] == ["train"] else "chunkpilot train"
        append_record(train_record(command, result.metrics, result.recipe, LINEUP, result.sources))

    data = None if args.from_tracking else args.data
    said = train_and_report(
        data, args.experiment, params, search_minutes, recipe, compare(args), args.older_engines, record
    )
    print(said)
    return 0
