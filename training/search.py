"""Optional hyperparameter search within a time budget: random LightGBM settings around the
defaults, each cross-validated on the same held-out slices as everything else; the lowest mean
regret wins. It stops before a trial would overrun the budget (the last trial's time is the guess)."""

from __future__ import annotations

import random
import time

from judge.metrics import slice_metrics
from judge.slices import Fold

from .crossval import cross_validate
from .data import Table
from .served import served_fit

# at most 300 trees of 31 leaves (the default): the service walks every tree of every member for
# each priced chunk of a dozen candidates on every answer
SPACE = {
    "num_leaves": [7, 15, 31],
    "learning_rate": [0.05, 0.1, 0.2],
    "num_boost_round": [120, 200, 300],
    "min_data_in_leaf": [3, 5, 10, 20],
    "feature_fraction": [0.6, 0.8, 0.9, 1.0],
    "lambda_l2": [0.0, 0.1, 1.0, 10.0],
}


def slice_regrets(recipe: dict, table: Table, slices: dict[str, list[Fold]]) -> dict[str, float]:
    """A recipe's ({"name", "lgbm", ...}) mean regret per held-out slice, and over all (`all`)."""
    name = recipe["name"]
    frame, _ = cross_validate(served_fit([name], recipe["lgbm"]), table, slices)[name]
    return {s: m["mean_regret"] for s, m in slice_metrics(frame).items()}


def search(
    recipe: str, base: dict, table: Table, slices: dict[str, list[Fold]], minutes: float, seed: int = 0
) -> tuple[dict, list[dict]]:
    """(the best params found, every trial as {params..., mean_regret, seconds}); the defaults first."""
    deadline, rng = time.monotonic() + 60 * minutes, random.Random(seed)
    trials: list[dict] = []
    candidate, last = dict(base), 0.0
    while time.monotonic() + last < deadline:
        t0 = time.monotonic()
        regret = slice_regrets({"name": recipe, "lgbm": candidate}, table, slices)["all"]
        last = time.monotonic() - t0
        trials.append({**candidate, "mean_regret": regret, "seconds": round(last, 1)})
        best = min(trials, key=lambda t: t["mean_regret"])
        print(
            f"search trial {len(trials)}: mean regret {regret:.2%} in {last:.0f} s "
            f"(best {best['mean_regret']:.2%}, {max(0.0, deadline - time.monotonic()):.0f} s left)",
            flush=True,
        )
        candidate = {**base, **{k: rng.choice(v) for k, v in SPACE.items()}}
    best = min(trials, key=lambda t: t["mean_regret"])
    return {k: v for k, v in best.items() if k not in ("mean_regret", "seconds")}, trials
