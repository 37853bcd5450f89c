"""The per-chunk cost model's features: (config row, query tokens q, history h) -> one row per
chunk. Its serving contract, like features.py for whole plans: the per-chunk cost model
(chunkpilot/cost_models.py) fits and predicts on it, in training and in the service alike."""

from __future__ import annotations

import numpy as np

from .contract import SHAPE_COLUMNS
from .features import ATTN_CODES, FEATURES, RUNTIME, linear_flops, visible_sum

# what a chunk's cost can depend on besides q and h: the model, the attention set-up, the machine
CONFIG = [
    *("window", "has_window", "layout", "sinks", "global_tokens", "local_fraction"),
    *SHAPE_COLUMNS,
    "parameters",
    *RUNTIME,
    *("l2_cache_mib", "l3_cache_mib"),
]
# the last is the analytic prior the model corrects (its target: log ms minus it)
CHUNK = [
    *("query_tokens", "history", "keys", "chunk_gflop", "score_mib", "masked", "mask_mib"),
    *("chunk_compute_ms", "log_base_ms"),
]
NAMES = (*CONFIG, *CHUNK)
COLUMNS = {name: FEATURES.index(name) for name in CONFIG}
_MASKED, _SPLIT = ATTN_CODES["masked"], ATTN_CODES["split"]


def chunk_features(config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
    """[chunks, NAMES]: `config` [chunks, FEATURES] is each chunk's config row."""
    col = {name: config[:, j] for name, j in COLUMNS.items()}
    window = np.where(col["has_window"] > 0, col["window"], np.inf)
    layers, heads, hd = col["num_layers"], col["num_heads"], col["head_dim"]
    local = layers * col["local_fraction"]
    # global tokens are extra keys once the window has moved past the first of them (roughly)
    keys_local = np.minimum(h, window) + q + col["global_tokens"] * (h > window)
    keys_global = h + q
    # the masked kernel's plain causal path (engine/attention.py) needs no history and a chunk within
    # the layer's window: no [q, keys] mask to build, and the upper triangle skipped, about half the
    # score work. Every other layer materialises a mask (one shot, or a window longer than the prompt,
    # was the per-chunk model's largest miss before this term: docs/training.md). The split kernel
    # builds no mask and computes only the keys each query sees.
    split = col["attn_impl"] == _SPLIT
    causal = (col["attn_impl"] == _MASKED) & (h == 0)
    masked_local = np.where(split, 0.0, 1.0 - (causal & (q <= window)))
    masked_global = np.where(split, 0.0, 1.0 - causal)
    d, kv, ff = col["hidden_size"], col["num_kv_heads"], col["intermediate_size"]
    linear = linear_flops(q, layers, d, heads, kv, hd, ff)
    dense = local * keys_local * (1 + masked_local) / 2 + (layers - local) * keys_global * (1 + masked_global) / 2
    seen = (local * visible_sum(q, h, window) + (layers - local) * visible_sum(q, h, np.inf)) / q
    scores = np.where(split, seen, dense)
    attention = 4 * heads * hd * q * scores
    compute_ms = (linear + attention) / (col["matmul_gflops"] * 1e9) * 1e3
    base = np.log(compute_ms + layers * col["call_overhead_ms"] + 0.1)
    keys = np.where(local > 0, keys_local, keys_global)
    masked = (local * masked_local + (layers - local) * masked_global) / layers  # share of layers with a mask
    mask_mib = q * (local * masked_local * keys_local + (layers - local) * masked_global * keys_global) * 4 / 2**20
    chunk = [q, h, keys, (linear + attention) / 1e9, heads * q * keys * 4 / 2**20, masked, mask_mib, compute_ms, base]
    return np.column_stack([config[:, list(COLUMNS.values())], *chunk])
