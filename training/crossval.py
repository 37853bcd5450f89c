"""Cross-validation over the held-out slices: fit on a fold's training configs, choose for its
held-out configs, and record each choice (judge.metrics scores them per slice)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from estimator.recipe import load_recipe
from judge.metrics import records
from judge.regret import regret_of
from judge.slices import Fold
from store import registry

from .baselines import Baseline, HeldOutPolicy
from .data import Table, every_candidate, telemetry_since
from .progress import Stage
from .served import choose_groups

Fit = Callable[[Table], dict[str, HeldOutPolicy]]  # a fold's training configs -> fitted policies by name


def fitted(make: Callable[[], Baseline]) -> Fit:
    """cross_validate's `fit` for one policy with fit/choose (a baseline)."""

    def fit(train: Table) -> dict[str, HeldOutPolicy]:
        policy = make()
        policy.fit(train)
        return {policy.name: policy}

    return fit


def cross_validate(
    fit: Fit, table: Table, slices: dict[str, list[Fold]], stage: Stage | None = None
) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Policy name -> (records of every held-out config in every fold of every slice, and the
    held-out TTFT predictions of policies that make them). A config can appear in several slices;
    `stage` hears of each fold done."""
    frames: dict[str, list] = defaultdict(list)
    predictions: dict[str, list] = defaultdict(list)
    for name, folds in slices.items():
        for i, (train_groups, test_groups) in enumerate(folds):
            test = table.subset(test_groups)
            for policy_name, policy in fit(table.subset(train_groups)).items():
                choice = policy.choose(test)
                frames[policy_name].append(records(test.rows, choice).assign(slice=name, fold=i))
                if choice.predicted_ms is not None:
                    predictions[policy_name].append(
                        pd.DataFrame(
                            {
                                "slice": name,
                                "measured_ms": test.rows.ttft_ms.to_numpy(),
                                "predicted_ms": choice.predicted_ms,
                            }
                        )
                    )
            if stage is not None:
                stage.fold_done(name)
    return {
        n: (
            pd.concat(f, ignore_index=True),
            pd.concat(predictions[n], ignore_index=True) if predictions[n] else pd.DataFrame(),
        )
        for n, f in frames.items()
    }


def on_recent_telemetry(data: Path, tracking_uri: str) -> Callable[[str, str, float], tuple[float, float, int]]:
    """promotion.settle's judge: two registered versions, as they serve (each choosing among every
    candidate), on the configs of the prefills after `since_ms` where both choices were measured ->
    (their mean regrets against the best measured size, the number of those configs)."""

    def compare(challenger: str, champion: str, since_ms: float) -> tuple[float, float, int]:
        recent = telemetry_since(data, pd.Timestamp(since_ms, unit="ms", tz="UTC"))
        if recent is None:
            return float("nan"), float("nan"), 0
        every = every_candidate(recent)
        picks = []
        for v in (challenger, champion):
            with registry.fetch(tracking_uri, version=v) as stored:
                picks.append(choose_groups(load_recipe(stored.recipe_dir), every).chunks)
        regrets: tuple[list[float], list[float]] = ([], [])
        for g, r in recent.rows.groupby("group", sort=False):
            measured = dict(zip(r.chunk_size, r.ttft_ms, strict=True))
            if all(p[g] in measured for p in picks):
                for regret, p in zip(regrets, picks, strict=True):
                    regret.append(regret_of(measured, p[g]))
        if not regrets[0]:
            return float("nan"), float("nan"), 0
        return float(np.mean(regrets[0])), float(np.mean(regrets[1])), len(regrets[0])

    return compare
