"""The per-chunk cost model: LightGBM on each chunk's measured ms, given its query tokens q and the
history h before it, on top of the config's model and hardware features. A candidate's TTFT is
the sum of its chunks' predicted costs, plus the first decode step (a chunk of one token after the
whole prompt) and tokenizing (ms per token, learnt). One config gives a row per chunk, not per
candidate, and a cost that composes across context lengths. Needs `chunk_ms` (dataset v2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np

from chunkpilot.chunk_features import chunk_features, predict_chunk_ms

from .data import Table
from .policies import DEFAULT_PARAMS, Choice, argmin_per_group, quiet_lgb


def expand(table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate's chunks: (row index into the table, query tokens, history) per chunk."""
    n = table.rows.context_length.to_numpy()
    c = np.minimum(table.rows.chunk_size.to_numpy(), n)
    m = np.ceil(n / c).astype(int)
    owner = np.repeat(np.arange(len(n)), m)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(m) - m, m)  # chunk number within its candidate
    h = k * c[owner]
    return owner, np.minimum(c[owner], n[owner] - h).astype(float), h.astype(float)


@dataclass
class PerChunkCost:
    params: dict = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    name: str = "lgbm-per-chunk"

    def fit(self, train: Table) -> None:
        owner, q, h = expand(train)
        measured = np.concatenate([np.asarray(ms, dtype=float) for ms in train.rows.chunk_ms])  # same order
        x = chunk_features(train.x[owner], q, h)
        params = quiet_lgb(objective="regression", **{**DEFAULT_PARAMS, **self.params})
        rounds = params.pop("num_boost_round")
        params.pop("rule_margin"), params.pop("rank_with_ranker")
        self.booster = lgb.train(params, lgb.Dataset(x, np.log(measured) - x[:, -1]), num_boost_round=rounds)
        self.tokenize_ms_per_token = float(np.median(train.rows.tokenize_ms / train.rows.context_length))

    def predict_ms(self, table: Table) -> np.ndarray:
        owner, q, h = expand(table)
        prefill = np.bincount(
            owner, weights=predict_chunk_ms(self.booster, table.x[owner], q, h), minlength=len(table.rows)
        )
        n = table.rows.context_length.to_numpy(float)
        decode = predict_chunk_ms(self.booster, table.x, np.ones_like(n), n)  # the first decode step: one token after n
        return prefill + decode + self.tokenize_ms_per_token * n

    def choose(self, test: Table) -> Choice:
        predicted = self.predict_ms(test)
        return Choice(argmin_per_group(test, predicted), predicted)
