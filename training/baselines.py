"""The baselines a recipe must beat, fitted on training configs and asked about held-out ones:
fixed sizes, the hand rule, lookups, a classifier, a ranker, and the regressor
with the ranker's order that was served before recipes (rank+level). Each returns, per held-out
group, the chosen chunk size among that group's measured (feasible) candidates. The served
recipes themselves are judged through training/served.py."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Protocol

import lightgbm as lgb
import numpy as np
import pandas as pd

from chunkpilot.chunks import clamp_chunk, landed, rule_candidate
from chunkpilot.cost_models import PerCandidate
from chunkpilot.features import FEATURES

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


def limited(rows: pd.DataFrame, chunk: int) -> int:
    """A fixed choice cut to what the config allows (ring: <= window; <= context), as the engine does."""
    first = rows.iloc[0]
    return clamp_chunk(chunk, int(first.context_length), int(first.window) or None, first.layout)


def rule_chunk(rows: pd.DataFrame) -> int:
    """The hand rule's size among a config's measured candidates."""
    first = rows.iloc[0]
    return rule_candidate(rows.chunk_size.tolist(), int(first.context_length), int(first.window) or None, first.layout)


def quiet_lgb(**params) -> dict:
    # one thread: these tables are small, and a second would spin-wait against other work
    return {"verbose": -1, "num_threads": 1, "seed": 0, **params}


@dataclass
class HeldOutChoices:
    """A policy's choice for every held-out config of a fold (a recipe's own, one request at a time:
    chunkpilot.recipe.Choice)."""

    chunks: dict[str, int]  # group -> chosen chunk size
    predicted_ms: np.ndarray | None = None  # per test row, for regressors
    deferred: set[str] | None = None  # groups where a do-no-harm recipe took the rule's size instead


class HeldOutPolicy(Protocol):
    """What training judges: asked about every held-out config of a fold at once (a served recipe,
    training/served.py, or a baseline)."""

    name: str

    def choose(self, test: Table) -> HeldOutChoices: ...


class Baseline(HeldOutPolicy, Protocol):
    """A held-out policy fitted on a fold's training configs first."""

    def fit(self, train: Table) -> None: ...


class FixedChunk:
    """One chunk size for every request (cut to what the config allows), as engines default to."""

    def __init__(self, size: int = 1024) -> None:
        self.size, self.name = size, f"fixed-{size}"

    def fit(self, train: Table) -> None:
        pass

    def choose(self, test: Table) -> HeldOutChoices:
        return HeldOutChoices(
            {
                g: landed(r.chunk_size.to_numpy(), limited(r, self.size))
                for g, r in test.rows.groupby("group", sort=False)
            }
        )


class BestFixed(FixedChunk):
    """The single fixed size with the lowest mean regret on the training configs."""

    def __init__(self) -> None:
        super().__init__(1024)
        self.name = "best-fixed"

    def fit(self, train: Table) -> None:
        configs = [
            (
                r.chunk_size.to_numpy(),
                r.ttft_ms.to_numpy(),
                int(first.context_length),
                int(first.window) or None,
                first.layout,
            )
            for _, r in train.rows.groupby("group", sort=False)
            for first in [r.iloc[0]]
        ]

        def mean_regret(size: int) -> float:
            return float(
                np.mean(
                    [
                        ttft[chunks == landed(chunks, clamp_chunk(size, n, window, layout))][0] / ttft.min() - 1
                        for chunks, ttft, n, window, layout in configs
                    ]
                )
            )

        self.size = min(sorted(train.rows.chunk_size.unique()), key=mean_regret)


class HandRule:
    """The hand rule engines' users write: 512 up to 512 tokens; 1024 up to 1536; beyond that 1024 on
    multiples of 1024, else 768."""

    name = "hand-rule"

    def fit(self, train: Table) -> None:
        pass

    def choose(self, test: Table) -> HeldOutChoices:
        return HeldOutChoices({g: rule_chunk(r) for g, r in test.rows.groupby("group", sort=False)})


class SimpleRule:
    """The strongest two-line rule (chunkpilot.chunks.simple_rule): one shot without a window, else
    the hand rule. Without a window, one shot is the largest measured size (the whole prompt)."""

    name = "simple-rule"

    def fit(self, train: Table) -> None:
        pass

    def choose(self, test: Table) -> HeldOutChoices:
        return HeldOutChoices(
            {
                g: int(r.chunk_size.max()) if int(r.window.iloc[0]) == 0 else rule_chunk(r)
                for g, r in test.rows.groupby("group", sort=False)
            }
        )


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


def baselines(every: bool = True) -> list:
    """Every baseline, or (every=False) the ones a user compares against and that cost seconds to
    cross-validate: fixed 1024, the best fixed size, the hand rule and the simple rule. (The analytic
    fit is a recipe: chunkpilot.recipe.RECIPES.)"""
    quick = [FixedChunk(1024), BestFixed(), HandRule(), SimpleRule()]
    return quick + [NearestConfig(), ChunkClassifier(), ChunkRanker(), RankLevel()] if every else quick
