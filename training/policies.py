"""Ways to choose a chunk size, fitted on training configs and asked about held-out ones: the
LightGBM TTFT regressor (the model) and every baseline it must beat. Each returns, per held-out
group, the chosen chunk size among that group's measured (feasible) candidates."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np
import pandas as pd

from chunkpilot.choice import pick
from chunkpilot.contract import fit_chunk, hand_rule
from chunkpilot.features import FEATURES, MONOTONE, base_log_ms, history_sum, keys_sum
from chunkpilot.registry import Stored

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
# 120 trees of 15 leaves: as good on held-out configs as 400 of 31 (README, Training) at a third of
# the serving time, which the decision's 0.2 ms budget needs
# rank_with_ranker, rule_margin: how the decision uses the predictions (predictor/choice.py); the
# service reads both from the registered run's params
DEFAULT_PARAMS = {
    "num_boost_round": 120,
    "learning_rate": 0.1,
    "num_leaves": 15,
    "min_data_in_leaf": 5,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "feature_fraction": 0.9,
    "rule_margin": 0.0,
    "rank_with_ranker": True,
}


def closest_measured(candidates: np.ndarray, chunk: int) -> int:
    """The measured candidate a fixed choice lands on: itself, else the largest below, else the smallest."""
    below = candidates[candidates <= chunk]
    return int(below.max()) if len(below) else int(candidates.min())


def limited(rows: pd.DataFrame, chunk: int) -> int:
    """A fixed choice cut to what the config allows (ring: <= window; <= context), as the engine does."""
    first = rows.iloc[0]
    return fit_chunk(chunk, int(first.context_length), int(first.window) or None, first.layout)


def rule_chunk(rows: pd.DataFrame) -> int:
    """The hand rule's size among a config's measured candidates."""
    return closest_measured(rows.chunk_size.to_numpy(), limited(rows, hand_rule(int(rows.context_length.iloc[0]))))


def quiet_lgb(**params) -> dict:
    # one thread: these tables are small, and a second would spin-wait against other work
    return {"verbose": -1, "num_threads": 1, "seed": 0, **params}


@dataclass
class Choice:
    chunks: dict[str, int]  # group -> chosen chunk size
    predicted_ms: np.ndarray | None = None  # per test row, for regressors
    deferred: set[str] | None = None  # groups where a do-no-harm policy took the rule's size instead


class FixedChunk:
    def __init__(self, size: int = 1024) -> None:
        self.size, self.name = size, f"fixed-{size}"

    def fit(self, train: Table) -> None:
        pass

    def choose(self, test: Table) -> Choice:
        return Choice(
            {
                g: closest_measured(r.chunk_size.to_numpy(), limited(r, self.size))
                for g, r in test.rows.groupby("group", sort=False)
            }
        )


class BestFixed(FixedChunk):
    """The single fixed size with the lowest mean regret on the training configs."""

    def __init__(self) -> None:
        super().__init__(1024)
        self.name = "best-fixed"

    def fit(self, train: Table) -> None:
        groups = list(train.rows.groupby("group", sort=False))
        best = {g: r.ttft_ms.min() for g, r in groups}

        def mean_regret(size: int) -> float:
            return float(
                np.mean(
                    [
                        r.ttft_ms.to_numpy()[
                            r.chunk_size.to_numpy() == closest_measured(r.chunk_size.to_numpy(), limited(r, size))
                        ][0]
                        / best[g]
                        - 1
                        for g, r in groups
                    ]
                )
            )

        self.size = min(sorted(train.rows.chunk_size.unique()), key=mean_regret)


class HandRule:
    name = "hand-rule"

    def fit(self, train: Table) -> None:
        pass

    def choose(self, test: Table) -> Choice:
        return Choice({g: rule_chunk(r) for g, r in test.rows.groupby("group", sort=False)})


def argmin_per_group(test: Table, predicted: np.ndarray) -> dict[str, int]:
    frame = pd.DataFrame(
        {"group": test.rows.group.to_numpy(), "chunk": test.rows.chunk_size.to_numpy(), "p": predicted}
    )
    return {g: int(r.chunk.iloc[int(np.argmin(r.p.to_numpy()))]) for g, r in frame.groupby("group", sort=False)}


class AnalyticFit:
    """vllm-ascend's profiled fit, summed over chunks: TTFT = a*sum C(C+H) + b*N + c*sum H + d,
    with H the history each chunk attends (capped by the window), least squares per
    (model, machine, dtype, threads, kernel) group; the pooled fit where a group is unseen."""

    name = "analytic-fit"
    KEYS = ["model", "hardware_id", "dtype", "threads", "attn_impl"]

    @staticmethod
    def _terms(rows: pd.DataFrame) -> np.ndarray:
        n = rows.context_length.to_numpy(float)
        c = np.minimum(rows.chunk_size.to_numpy(float), n)
        w = np.where(rows.window.to_numpy() > 0, rows.window.to_numpy(float), np.inf)
        return np.column_stack([keys_sum(n, c, w), n, history_sum(n, c, w), np.ones_like(n)])

    def fit(self, train: Table) -> None:
        def solve(rows: pd.DataFrame) -> np.ndarray:
            return np.linalg.lstsq(self._terms(rows), rows.ttft_ms.to_numpy(), rcond=None)[0]

        self.pooled = solve(train.rows)
        self.coef = {key: solve(r) for key, r in train.rows.groupby(self.KEYS) if len(r) >= 4}

    def choose(self, test: Table) -> Choice:
        predicted = np.empty(len(test.rows))
        for key, r in test.rows.groupby(self.KEYS):
            predicted[r.index.to_numpy()] = self._terms(r) @ self.coef.get(key, self.pooled)
        return Choice(argmin_per_group(test, predicted), np.maximum(predicted, 1e-3))


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

    def choose(self, test: Table) -> Choice:
        x, first = _config_matrix(test)
        x = (np.log1p(np.abs(x)) - self.mean) / self.std
        nearest = ((x[:, None, :] - self.x[None]) ** 2).sum(-1).argmin(1)
        chunks = {}
        for g, target in zip(first.group, self.best[nearest], strict=True):
            candidates = test.rows.chunk_size[test.rows.group == g].to_numpy()
            chunks[g] = closest_measured(candidates, int(target))
        return Choice(chunks)


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
            self.model = lgb.LGBMClassifier(**quiet_lgb(n_estimators=200, learning_rate=0.05, min_child_samples=3))
            with warnings.catch_warnings():  # few configs per best size is this baseline's nature, not news
                warnings.filterwarnings("ignore", message="The number of unique classes")
                self.model.fit(x, np.searchsorted(self.classes, labels))

    def choose(self, test: Table) -> Choice:
        x, first = _config_matrix(test)
        if self.single is not None:
            proba = np.ones((len(first), 1))
        else:
            proba = self.model.predict_proba(x)
        chunks = {}
        for g, p in zip(first.group, proba, strict=True):
            candidates = test.rows.chunk_size[test.rows.group == g].to_numpy()
            feasible = [(prob, c) for prob, c in zip(p, self.classes, strict=True) if c in candidates]
            chunks[g] = (
                int(max(feasible)[1]) if feasible else closest_measured(candidates, int(self.classes[np.argmax(p)]))
            )
        return Choice(chunks)


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

    def choose(self, test: Table) -> Choice:
        return Choice(argmin_per_group(test, -self.model.predict(test.x)))


@dataclass
class TTFTRegressor:
    """The model: LightGBM on log TTFT per (config, chunk size), learning the correction to the
    analytic estimate (`base_log_ms`, part of the serving contract). With `rank_with_ranker` an
    LGBMRanker's order within the config is combined with the regressor's levels; with
    `rule_margin` the hand rule's size is kept unless the pick is predicted to save more than that
    (predictor/choice.py: the same decision the service makes)."""

    params: dict = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    name: str = "lgbm-regressor"

    def fit(self, train: Table) -> None:
        params = quiet_lgb(
            objective="regression", monotone_constraints=list(MONOTONE), **{**DEFAULT_PARAMS, **self.params}
        )
        rounds = params.pop("num_boost_round")
        self.rule_margin, ranked = params.pop("rule_margin"), params.pop("rank_with_ranker")
        data = lgb.Dataset(train.x, train.y - base_log_ms(train.x), feature_name=list(FEATURES), free_raw_data=False)
        self.booster = lgb.train(params, data, num_boost_round=rounds)
        self.ranker = ChunkRanker() if ranked else None
        if self.ranker is not None:
            self.ranker.fit(train)

    @classmethod
    def load(cls, stored: Stored) -> TTFTRegressor:
        """A registered version as it serves: its booster, its ranker and its recipe's rule margin."""
        model = cls(stored.recipe, f"v{stored.version}")
        model.booster, model.rule_margin = lgb.Booster(model_file=str(stored.model_file)), stored.recipe["rule_margin"]
        model.ranker = None
        if stored.ranker_file is not None:
            model.ranker = ChunkRanker()
            model.ranker.model = lgb.Booster(model_file=str(stored.ranker_file))
        return model

    def predict_log_ms(self, table: Table) -> np.ndarray:
        return self.booster.predict(table.x) + base_log_ms(table.x)

    def choose(self, test: Table) -> Choice:
        level = self.predict_log_ms(test)
        score = None if self.ranker is None else self.ranker.model.predict(test.x)
        return choose_per_group(test, level, score, lambda i, best, rule: self.rule_margin)


def choose_per_group(
    test: Table, level: np.ndarray, score: np.ndarray | None, margin: Callable[[np.ndarray, int, int], float]
) -> Choice:
    """chunkpilot.choice.pick for every held-out config; `margin(rows, argmin, rule)` (positions
    within the config) gives its rule margin."""
    chunks, deferred = {}, set()
    for g, r in test.rows.groupby("group", sort=False):
        i = r.index.to_numpy()
        rule = int(np.flatnonzero(r.chunk_size.to_numpy() == rule_chunk(r))[0])
        best, to_rule = pick(
            level[i].tolist(),
            None if score is None else score[i].tolist(),
            rule,
            margin(i, int(np.argmin(level[i])), rule),
        )
        chunks[g] = int(r.chunk_size.iloc[best])
        if to_rule:
            deferred.add(g)
    return Choice(chunks, np.exp(level), deferred)


@dataclass
class DoNoHarm:
    """An ensemble of regressors (seeds and bagging differ); the argmin of their mean log TTFT,
    unless its predicted saving over the hand rule's size is within `z` standard deviations of the
    members' disagreement: then the rule's size, whose worst case users already know."""

    params: dict = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    members: int = 5
    z: float = 1.0
    name: str = "lgbm-do-no-harm"

    def fit(self, train: Table) -> None:
        self.models = []
        for seed in range(self.members):
            model = TTFTRegressor(
                {
                    **self.params,
                    "seed": seed,
                    "bagging_fraction": 0.7,
                    "feature_fraction": 0.7,
                    "rule_margin": 0.0,
                    "rank_with_ranker": False,
                }
            )
            model.fit(train)
            self.models.append(model)

    def choose(self, test: Table) -> Choice:
        predicted = np.stack([m.predict_log_ms(test) for m in self.models])  # [K, rows]
        sd = predicted.std(0)
        return choose_per_group(
            test,
            predicted.mean(0),
            None,
            lambda i, best, rule: float(np.expm1(self.z * np.hypot(sd[i][best], sd[i][rule]))),
        )


def variants(params: dict, rows: pd.DataFrame) -> list:
    """Other models, judged beside the default on the same slices (any that equals it is left
    out): the regressor alone, with the ranker's order, with a 5% rule margin, the ensemble, and
    the per-chunk cost model where every row has per-chunk times (dataset v2)."""
    from .chunk_cost import PerChunkCost

    plain = {**params, "rule_margin": 0.0, "rank_with_ranker": False}
    others = [
        TTFTRegressor(plain, "lgbm-argmin"),
        TTFTRegressor({**plain, "rank_with_ranker": True}, "lgbm-rank-level"),
        TTFTRegressor({**plain, "rule_margin": 0.05}, "lgbm-rule-margin"),
    ]
    per_chunk = [PerChunkCost(params)] if rows.chunk_ms.notna().all() else []
    return [v for v in others if {**DEFAULT_PARAMS, **v.params} != {**DEFAULT_PARAMS, **params}] + [
        DoNoHarm(params),
        *per_chunk,
    ]


def baselines() -> list:
    return [FixedChunk(1024), BestFixed(), HandRule(), AnalyticFit(), NearestConfig(), ChunkClassifier(), ChunkRanker()]
