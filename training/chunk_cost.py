"""The per-chunk cost model: LightGBM on each chunk's measured ms, given its query tokens q and the
history h before it, on top of the config's model and hardware features. A candidate's TTFT is
the sum of its chunks' predicted costs, plus the first decode step (a chunk of one token after the
whole prompt) and tokenizing (ms per token, learnt). One config gives a row per chunk, not per
candidate, and a cost that composes across context lengths. Needs `chunk_ms` (dataset v2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np

from chunkpilot.features import FEATURES

from .data import Table
from .policies import DEFAULT_PARAMS, Choice, argmin_per_group, quiet_lgb

# what a chunk's cost can depend on besides q and h: the model, the attention set-up, the machine
CONFIG = [
    "window",
    "has_window",
    "layout",
    "sinks",
    "local_fraction",
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "parameters",
    "dtype_bytes",
    "attn_impl",
    "threads",
    "matmul_gflops",
    "bandwidth_gbs",
    "call_overhead_ms",
    "cores",
    "l2_cache_mib",
    "l3_cache_mib",
]
CHUNK = ["query_tokens", "history", "keys", "chunk_gflop", "score_mib", "chunk_compute_ms", "log_base_ms"]
COLUMNS = {name: FEATURES.index(name) for name in CONFIG}


def chunk_features(config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
    """[chunks, CONFIG + CHUNK]: `config` [chunks, FEATURES] is each chunk's config row."""
    col = {name: config[:, j] for name, j in COLUMNS.items()}
    window = np.where(col["has_window"] > 0, col["window"], np.inf)
    layers, heads, hd = col["num_layers"], col["num_heads"], col["head_dim"]
    local = layers * col["local_fraction"]
    keys_local, keys_global = np.minimum(h, window) + q, h + q
    d, kv, ff = col["hidden_size"], col["num_kv_heads"], col["intermediate_size"]
    linear = 2 * q * layers * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * ff)
    attention = 4 * heads * hd * q * (local * keys_local + (layers - local) * keys_global)
    compute_ms = (linear + attention) / (col["matmul_gflops"] * 1e9) * 1e3
    base = np.log(compute_ms + layers * col["call_overhead_ms"] + 0.1)
    keys = np.where(local > 0, keys_local, keys_global)
    chunk = [q, h, keys, (linear + attention) / 1e9, heads * q * keys * 4 / 2**20, compute_ms, base]
    return np.column_stack([config[:, list(COLUMNS.values())], *chunk])


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
        x = chunk_features(table.x[owner], q, h)
        per_chunk = np.exp(self.booster.predict(x) + x[:, -1])
        prefill = np.bincount(owner, weights=per_chunk, minlength=len(table.rows))
        n = table.rows.context_length.to_numpy(float)
        decode = chunk_features(table.x, np.ones_like(n), n)  # the first decode step: one token after n
        return prefill + np.exp(self.booster.predict(decode) + decode[:, -1]) + self.tokenize_ms_per_token * n

    def choose(self, test: Table) -> Choice:
        predicted = self.predict_ms(test)
        return Choice(argmin_per_group(test, predicted), predicted)
