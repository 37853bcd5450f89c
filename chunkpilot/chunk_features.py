"""The per-chunk cost model's features: (config row, query tokens q, history h) -> one row per
chunk. Its serving contract, like features.py for whole plans: the per-chunk cost model
(estimator/cost_models.py) fits and predicts on it, in training and in the service alike."""

from __future__ import annotations

import numpy as np

from .contract import SHAPE_COLUMNS
from .features import ATTN_CODES, FEATURES, LAYOUT_CODES, RUNTIME, linear_flops, shift_in_one_call, visible_sum

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
CONFIG_COLUMNS = list(COLUMNS.values())  # their places among FEATURES
_EAGER, _SPLIT, _SHIFT = ATTN_CODES["eager"], ATTN_CODES["split"], LAYOUT_CODES["shift"]


def chunk_features(config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
    """[chunks, NAMES]: `config` [chunks, FEATURES] is each chunk's config row."""
    # a request's chunks share one config: its values as scalars cost a fraction of columns' arithmetic
    values = config[:, CONFIG_COLUMNS]
    shared = len(config) > 0 and bool((values == values[0]).all())
    col = {name: config[0, j] if shared else config[:, j] for name, j in COLUMNS.items()}
    window = np.where(col["has_window"] > 0, col["window"], np.inf)
    layers, heads, hd = col["num_layers"], col["num_heads"], col["head_dim"]
    local = layers * col["local_fraction"]
    # global tokens are extra keys once the window has moved past the first of them (roughly)
    keys_local = np.minimum(h, window) + q + col["global_tokens"] * (h > window)
    keys_global = h + q
    # A dense kernel's plain causal path (engine/attention.py) needs no history and a chunk within the
    # layer's window: no [q, keys] mask to build, and the upper triangle skipped, about half the score
    # work. Every other chunk materialises a mask (one shot, or a window longer than the prompt, was
    # the per-chunk model's largest miss before this term: docs/training.md). The split kernel builds
    # no mask and computes only the keys each query sees (`visible_sum`), but for a shift layer's
    # chunk of at most half the window, which it attends in one call with the step's mask.
    split = col["attn_impl"] == _SPLIT
    dense_local = ~split | ((col["layout"] == _SHIFT) & shift_in_one_call(q, window))
    dense_global = ~split
    plain = (col["attn_impl"] != _EAGER) & (h == 0)
    masked_local = np.where(dense_local, 1.0 - (plain & (q <= window)), 0.0)
    masked_global = np.where(dense_global, 1.0 - plain, 0.0)
    d, kv, ff = col["hidden_size"], col["num_kv_heads"], col["intermediate_size"]
    linear = linear_flops(q, layers, d, heads, kv, hd, ff)
    per_local = np.where(dense_local, keys_local * (1 + masked_local) / 2, visible_sum(q, h, window) / q)
    per_global = np.where(dense_global, keys_global * (1 + masked_global) / 2, visible_sum(q, h, np.inf) / q)
    scores = local * per_local + (layers - local) * per_global
    attention = 4 * heads * hd * q * scores
    compute_ms = (linear + attention) / (col["matmul_gflops"] * 1e9) * 1e3
    base = np.log(compute_ms + layers * col["call_overhead_ms"] + 0.1)
    keys = np.where(local > 0, keys_local, keys_global)
    masked = (local * masked_local + (layers - local) * masked_global) / layers  # share of layers with a mask
    mask_mib = q * (local * masked_local * keys_local + (layers - local) * masked_global * keys_global) * 4 / 2**20
    chunk = [q, h, keys, (linear + attention) / 1e9, heads * q * keys * 4 / 2**20, masked, mask_mib, compute_ms, base]
    out = np.empty((len(q), len(NAMES)))
    out[:, : len(CONFIG)] = values
    for j, column in enumerate(chunk, len(CONFIG)):
        out[:, j] = column
    return out
