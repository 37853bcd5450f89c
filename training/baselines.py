"""The baselines a recipe must beat, fitted on training configs and asked about held-out ones: the
lineup every judge uses (judge.lineup: one shot, the backend's default, the best single size
of the machine, the rules, fixed 1024, and the strongest of them per machine), lookups, a
classifier, a ranker, and the regressor with the ranker's order that was served before recipes
(rank+level). Each returns, per held-out group, the chosen chunk size among that group's measured
(feasible) candidates. The served recipes themselves are judged through training/served.py."""

from __future__ import annotations

import warnings
from typing import Protocol

import lightgbm as lgb
import numpy as np
import pandas as pd

from chunkpilot.chunks import describe_hand_rule, landed
from chunkpilot.features import FEATURES
from estimator.cost_models import PerCandidate
from judge.lineup import (
    anchor_for,
    applied,
    backend_default,
    best_single_size,
    fit_anchors,
    machine_or_pooled,
    with_pooled,
)
from judge.metrics import HeldOutChoices

from .data import Table

CHUNK_DEPENDENT = {
    "chunk_size",
    "num_chunks",
    "last_chunk",
    "chunk_over_context",
    "attention_gflop",
    "chunk_score_mib",
    "compute_ms",
    "overhead_ms",
}
CONFIG_FEATURES = [i for i, name in enumerate(FEATURES) if name not in CHUNK_DEPENDENT]


def quiet_lgb(**params) -> dict:
    # one thread: these tables are small, and a second would spin-wait against other work
    return {"verbose": -1, "num_threads": 1, "seed": 0, **params}


class HeldOutPolicy(Protocol):
    """What training judges: asked about every held-out config of a fold at once (a served recipe,
    training/served.py, or a baseline)."""

    name: str

    def choose(self, test: Table) -> HeldOutChoices: ...


class Baseline(HeldOutPolicy, Protocol):
    """A held-out policy fitted on a fold's training configs first."""

    def fit(self, train: Table) -> None: ...


class Spec:
    """A baseline of the lineup (judge.lineup) on held-out configs: the size its spec runs for
    each config, landed on the config's measured sizes, as the engine would run it."""

    name: str

    def spec(self, group: str) -> str:
        raise NotImplementedError

    def fit(self, train: Table) -> None:
        pass

    def choose(self, test: Table) -> HeldOutChoices:
        configs = test.measured_configs()
        self.keys = test.group_keys()
        return HeldOutChoices(
            {
                g: landed(c.sizes, applied(self.spec(g), c.context_length, c.window, c.layout))
                for g, c in configs.items()
            }
        )


class FixedSpec(Spec):
    """One spec for every config: one shot, a rule or a fixed size, as engines default to."""

    def __init__(self, name: str, spec: str, what: str = "") -> None:
        self.name, self._spec, self.what = name, spec, what or type(self).__doc__

    def spec(self, group: str) -> str:
        return self._spec


class BackendDefault(Spec):
    """What each config's backend does when nobody picks a size (judge.lineup.backend_default)."""

    name = "backend-default"

    def spec(self, group: str) -> str:
        return backend_default(self.keys[group].split("/")[1]).spec


class BestSingleSize(Spec):
    """The one size with the lowest mean regret on the training configs of the same machine,
    backend and kernel (over every machine of that backend and kernel where the machine has none):
    what a user keeps after one sweep of the machine."""

    name = "best-single-size"

    def fit(self, train: Table) -> None:
        self.sizes = {key: best_single_size(configs) for key, configs in with_pooled(train.anchor_configs).items()}

    def spec(self, group: str) -> str:
        hardware, backend, kernel = self.keys[group].split("/")
        return machine_or_pooled(self.sizes, hardware, backend, kernel) or backend_default(backend).spec


class Strongest(Spec):
    """The strongest baseline of each config's machine, backend and kernel on the training configs
    (judge.lineup.fit_anchors): the anchor of the served recipe's do-no-harm."""

    name = "strongest-baseline"

    def fit(self, train: Table) -> None:
        self.anchors = fit_anchors(train.anchor_configs)

    def spec(self, group: str) -> str:
        hardware, backend, kernel = self.keys[group].split("/")
        return anchor_for(self.anchors, hardware, backend, kernel).spec


# the lineup's baselines as training names them (one shot, the backend default, the best single size,
# the rules, fixed 1024) and the strongest of them per machine
def lineup_baselines() -> list[Spec]:
    return [
        FixedSpec("one-shot", "full", "The whole prompt in one chunk (a ring's window where the prompt is longer)"),
        BackendDefault(),
        BestSingleSize(),
        FixedSpec("hand-rule", "rule", f"The hand rule engines' users write: {describe_hand_rule()}"),
        FixedSpec("simple-rule", "simple-rule", "One shot without a window, else the hand rule"),
        FixedSpec("fixed-1024", "1024", "1024 tokens a chunk for every request (cut to what the config allows)"),
        Strongest(),
    ]


def argmin_per_group(test: Table, predicted: np.ndarray) -> dict[str, int]:
    frame = pd.DataFrame(
        {"group": test.rows.group.to_numpy(), "chunk": test.rows.chunk_size.to_numpy(), "p": predicted}
    )
    return {g: int(r.chunk.iloc[int(np.argmin(r.p.to_numpy()))]) for g, r in frame.groupby("group", sort=False)}


def _config_matrix(table: Table) -> tuple[np.ndarray, pd.DataFrame]:
    first = table.rows.drop_duplicates("group")
    return table.x[first.index.to_numpy()][:, CONFIG_FEATURES], first


class NearestConfig:
    """Lookup: the best chunk size of the nearest profiled config (standardised config features)."""

    name = "nearest-config"

    def fit(self, train: Table) -> None:
        x, first = _config_matrix(train)
        x = np.log1p(np.abs(x))
        self.mean, self.std = x.mean(0), x.std(0) + 1e-9
        self.x = (x - self.mean) / self.std
        self.best = train.best_chunk.reindex(first.group).to_numpy()

    def choose(self, test: Table) -> HeldOutChoices:
        x, first = _config_matrix(test)
        x = (np.log1p(np.abs(x)) - self.mean) / self.std
        nearest = ((x[:, None, :] - self.x[None]) ** 2).sum(-1).argmin(1)
        chunks = {}
        for g, target in zip(first.group, self.best[nearest], strict=True):
            candidates = test.rows.chunk_size[test.rows.group == g].to_numpy()
            chunks[g] = landed(candidates, int(target))
        return HeldOutChoices(chunks)


class ChunkClassifier:
    """A LightGBM classifier from config features to the best chunk size; the most probable
    feasible class wins."""

    name = "lgbm-classifier"

    def fit(self, train: Table) -> None:
        x, first = _config_matrix(train)
        labels = train.best_chunk.reindex(first.group).to_numpy()
        self.classes = np.unique(labels)
        self.single = self.classes[0] if len(self.classes) == 1 else None
        if self.single is None:
            # 100 trees a class: a dozen classes make this the slowest baseline to cross-validate
            self.model = lgb.LGBMClassifier(**quiet_lgb(n_estimators=100, learning_rate=0.1, min_child_samples=3))
            with warnings.catch_warnings():  # few configs per best size is this baseline's nature, not news
                warnings.filterwarnings("ignore", message="The number of unique classes")
                self.model.fit(x, np.searchsorted(self.classes, labels))

    def choose(self, test: Table) -> HeldOutChoices:
        x, first = _config_matrix(test)
        if self.single is not None:
            proba = np.ones((len(first), 1))
        else:
            proba = self.model.predict_proba(x)
        chunks = {}
        for g, p in zip(first.group, proba, strict=True):
            candidates = test.rows.chunk_size[test.rows.group == g].to_numpy()
            feasible = [(prob, c) for prob, c in zip(p, self.classes, strict=True) if c in candidates]
            chunks[g] = int(max(feasible)[1]) if feasible else landed(candidates, int(self.classes[np.argmax(p)]))
        return HeldOutChoices(chunks)


class ChunkRanker:
    """LightGBM LambdaRank over each config's candidates, graded by regret."""

    name = "lgbm-ranker"

    def fit(self, train: Table) -> None:
        rows = train.rows
        regret = rows.ttft_ms / rows.groupby("group", sort=False).ttft_ms.transform("min") - 1
        grade = np.select([regret <= 0, regret <= 0.05, regret <= 0.10, regret <= 0.25], [4, 3, 2, 1], 0)
        sizes = rows.groupby("group", sort=False).size().to_numpy()
        self.model = lgb.LGBMRanker(**quiet_lgb(n_estimators=200, learning_rate=0.05, min_child_samples=3))
        self.model.fit(train.x, grade, group=sizes)

    def choose(self, test: Table) -> HeldOutChoices:
        return HeldOutChoices(argmin_per_group(test, -self.model.predict(test.x)))


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values), dtype=int)
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def rank_level(log_ms: np.ndarray, rank_score: np.ndarray) -> int:
    """The lowest sum of the levels' rank and the ranker's rank (higher score: better); the level
    breaks ties."""
    combined = _ranks(log_ms) + _ranks(-rank_score)
    return int(np.lexsort((log_ms, combined))[0])


class RankLevel:
    """What served before recipes: the per-candidate regressor's levels (one member) combined with
    a LambdaRank ranker's order within the config."""

    name = "lgbm-rank-level"

    def fit(self, train: Table) -> None:
        self.levels = PerCandidate(size=1)
        self.levels.fit(train.measured)
        self.ranker = ChunkRanker()
        self.ranker.fit(train)

    def choose(self, test: Table) -> HeldOutChoices:
        level = self.levels.members(test.x)[0]
        score = self.ranker.model.predict(test.x)
        chunks = {}
        for g, r in test.rows.groupby("group", sort=False):
            i = r.index.to_numpy()
            chunks[g] = int(r.chunk_size.iloc[rank_level(level[i], score[i])])
        return HeldOutChoices(chunks, np.exp(level))


LINEUP = {b.name for b in lineup_baselines()}  # the simple baselines: the strongest of them is what auto must beat


def baselines(every: bool = True) -> list:
    """Every baseline, or (every=False) the lineup a user compares against, seconds to
    cross-validate (judge.lineup). (The analytic fit is a recipe: estimator.recipe.RECIPES.)"""
    quick = lineup_baselines()
    return quick + [NearestConfig(), ChunkClassifier(), ChunkRanker(), RankLevel()] if every else quick
