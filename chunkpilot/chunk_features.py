"""The per-chunk cost model's features: (config row, query tokens q, history h) -> one row per
chunk. Its serving contract, like features.py for whole plans: the per-chunk cost model
(chunkpilot/cost_models.py) fits and predicts on it, in training and in the service alike."""

from __future__ import annotations

import numpy as np

from .contract import SHAPE_COLUMNS
from .features import FEATURES, RUNTIME

# what a chunk's cost can depend on besides q and h: the model, the attention set-up, the machine
CONFIG = [
    *("window", "has_window", "layout", "sinks", "global_tokens", "local_fraction"),
    *SHAPE_COLUMNS,
    "parameters",
    *RUNTIME,
    *("l2_cache_mib", "l3_cache_mib"),
]
CHUNK = ["query_tokens", "history", "keys", "chunk_gflop", "score_mib", "chunk_compute_ms", "log_base_ms"]
COLUMNS = {name: FEATURES.index(name) for name in CONFIG}


def chunk_features(config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
    """[chunks, CONFIG + CHUNK]: `config` [chunks, FEATURES] is each chunk's config row."""
    col = {name: config[:, j] for name, j in COLUMNS.items()}
    window = np.where(col["has_window"] > 0, col["window"], np.inf)
    layers, heads, hd = col["num_layers"], col["num_heads"], col["head_dim"]
    local = layers * col["local_fraction"]
    # global tokens are extra keys once the window has moved past the first of them (roughly)
    keys_local = np.minimum(h, window) + q + col["global_tokens"] * (h > window)
    keys_global = h + q
    d, kv, ff = col["hidden_size"], col["num_kv_heads"], col["intermediate_size"]
    linear = 2 * q * layers * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * ff)
    attention = 4 * heads * hd * q * (local * keys_local + (layers - local) * keys_global)
    compute_ms = (linear + attention) / (col["matmul_gflops"] * 1e9) * 1e3
    base = np.log(compute_ms + layers * col["call_overhead_ms"] + 0.1)
    keys = np.where(local > 0, keys_local, keys_global)
    chunk = [q, h, keys, (linear + attention) / 1e9, heads * q * keys * 4 / 2**20, compute_ms, base]
    return np.column_stack([config[:, list(COLUMNS.values())], *chunk])
