"""`chunkpilot train`: the model and its baselines on the profiled dataset, logged to MLflow."""

from __future__ import annotations

import argparse
from pathlib import Path

from chunkpilot.contract import ConfigError, number

HELP = "train the chunk-size model, log it and its baselines to MLflow, register a champion"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=Path("data/ttft"), help="dataset root (default data/ttft)")
    parser.add_argument(
        "--from-tracking",
        action="store_true",
        help="train on what every machine published to the tracking server (MLFLOW_TRACKING_URI): "
        "profiled configs and telemetry batches, instead of --data's files",
    )
    parser.add_argument("--experiment", default="chunk-size", help="MLflow experiment")
    parser.add_argument("--n-estimators", help="LightGBM trees (default 120)")
    parser.add_argument("--num-leaves", help="LightGBM leaves per tree (default 15)")
    parser.add_argument("--learning-rate", help="LightGBM learning rate (default 0.1)")
    parser.add_argument("--search-minutes", help="budget of a random hyperparameter search (default: no search)")
    parser.add_argument("--recipe", help="the recipe to register (chunkpilot.recipe.RECIPES; default: DEFAULT)")


def run(args: argparse.Namespace) -> int:
    params: dict = {}
    if args.n_estimators is not None:
        params["num_boost_round"] = number("n_estimators", args.n_estimators, int, ge=1, le=100_000)
    if args.num_leaves is not None:
        params["num_leaves"] = number("num_leaves", args.num_leaves, int, ge=2, le=100_000)
    if args.learning_rate is not None:
        params["learning_rate"] = number("learning_rate", args.learning_rate, float, gt=0, le=1)
    search_minutes = (
        0.0 if args.search_minutes is None else number("search_minutes", args.search_minutes, float, gt=0, le=24 * 60)
    )

    from chunkpilot.recipe import DEFAULT, RECIPES

    recipe = args.recipe or DEFAULT
    if recipe not in RECIPES:
        raise ConfigError("recipe", f"must be one of {', '.join(RECIPES)}; got {recipe!r}")

    from training.train import train_and_report

    data = None if args.from_tracking else args.data
    print(train_and_report(data, args.experiment, params, search_minutes, recipe))
    return 0
