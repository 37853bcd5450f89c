"""The feature builder: (config, candidate chunk size) -> one row of model features.

It is the serving contract: training builds its matrix with it and the service builds each
request's candidate rows with it, so the two cannot disagree. Columns in, numpy out, vectorised
over rows, no pandas, torch or transformers: a request's dozen candidates cost microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .chunks import chunk_count, last_chunk
from .contract import NO_WINDOW

Num = float | np.ndarray  # a column, or one value shared by every row

# What a row must provide (dataset columns; the service fills the same names from a request).
# fmt: off
INPUT_COLUMNS = (
    "context_length", "chunk_size", "window", "layout", "sinks", "global_tokens", "global_every",
    "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
    "parameters", "dtype", "threads", "attn_impl", "backend", "quant",
    "matmul_gflops", "bandwidth_gbs", "call_overhead_ms", "cores", "l2_cache_bytes", "l3_cache_bytes",
)
# fmt: on
LAYOUT_CODES = {NO_WINDOW: 0, "shift": 1, "ring": 2}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# llama.cpp's weights, bits per weight (Q8_0: 32 int8 and an f16 scale a block; Q4_K_M: llama.cpp's
# own figure for its mix of Q4_K and Q6_K); a row without a quantisation holds its dtype's
QUANT_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q4_k_m": 4.89}
ATTN_CODES = {"masked": 0, "eager": 1, "split": 2, "flash": 3}
BACKEND_CODES = {"chunkpilot": 0, "transformers": 1, "llama.cpp": 2}
# how a model runs and on what: the features that, with the shape, make a kind of request
RUNTIME = (
    "backend",
    "dtype_bytes",
    "weight_bits",
    "attn_impl",
    "threads",
    "matmul_gflops",
    "bandwidth_gbs",
    "call_overhead_ms",
    "cores",
)

# fmt: off
FEATURES = (
    # the request
    "context_length", "chunk_size", "num_chunks", "last_chunk", "chunk_over_context",
    "window", "has_window", "layout", "sinks", "global_tokens", "local_fraction",
    # the model
    "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
    "parameters", "dtype_bytes", "weight_bits", "attn_impl", "backend",
    # the hardware
    "threads", "matmul_gflops", "bandwidth_gbs", "call_overhead_ms", "cores", "l2_cache_mib", "l3_cache_mib",
    # analytic terms
    "linear_gflop", "attention_gflop", "kv_mib", "chunk_score_mib", "compute_ms", "overhead_ms",
)
# fmt: on
# TTFT cannot fall as the context grows with everything else fixed
MONOTONE = tuple(1 if name == "context_length" else 0 for name in FEATURES)


def keys_sum(n: Num, c: Num, window: Num) -> Num:
    """Sum over chunks of (query tokens x keys attended) for prompt n in chunks of c, keys limited
    to the last `window` tokens plus the chunk (window = inf: no limit). Closed form, no loop:
    all chunks but the last have c queries and min(start, window) + c keys."""
    window = np.minimum(window, n)  # a window as long as the prompt limits nothing; keeps it finite
    m, last = chunk_count(n, c), last_chunk(n, c)
    full = m - 1  # chunks of exactly c tokens
    below = np.minimum(full, np.floor(window / c) + 1)  # of those, starts k*c still <= window
    starts = c * below * (below - 1) / 2 + window * (full - below)
    return c * c * full + c * starts + last * (np.minimum((m - 1) * c, window) + last)


def linear_flops(tokens: Num, layers: Num, d: Num, heads: Num, kv: Num, hd: Num, ff: Num) -> Num:
    """Projections and MLP over `tokens` tokens: 2 FLOPs per weight per token (the profiler's time
    model uses it too)."""
    return 2 * tokens * layers * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * ff)


def visible_sum(q: Num, h: Num, window: Num) -> Num:
    """Sum over a chunk's q queries, after h tokens of history, of the keys each sees: query i sees
    min(h + i + 1, window) (window = inf: no limit). What attention must compute at the least, and
    all that the split kernel computes (engine/attention.py). Closed form."""
    t = np.clip(window - h, 0, q)  # queries whose keys all fit the window
    return t * h + t * (t + 1) / 2 + (q - t) * np.minimum(window, q + h)  # no query past it without a window


def shift_in_one_call(q: Num, window: Num) -> Num:
    """Whether the split kernel attends a shift layer's q-query chunk in one call with the step's
    mask instead of in blocks: its keys are the window's last W-1 and itself, so at most a third of
    the scores is wasted, where blocks cost three kernel calls, two flips and a merge."""
    return 2 * q <= window


def history_sum(n: Num, c: Num, window: Num) -> Num:
    """Sum over chunks of the history each chunk attends to, min(start, window). Closed form."""
    window = np.minimum(window, n)
    m = chunk_count(n, c)
    below = np.minimum(m, np.floor(window / c) + 1)  # chunks whose start k*c is still <= window
    return c * below * (below - 1) / 2 + window * (m - below)


def _numbers(value: np.ndarray | list | float) -> Num:
    """A column as float64; a value shared by every row stays a Python float, whose arithmetic
    costs a twentieth of numpy's on a 0-d array (a request is one config and a dozen candidates)."""
    return float(value) if isinstance(value, int | float) else np.asarray(value, dtype=np.float64)


def _codes(value: np.ndarray | list | str, table: dict[str, int]) -> Num:
    if isinstance(value, str):
        return float(table[value])
    return np.array([table[v] for v in value], dtype=np.float64)


def _weight_bits(quant: np.ndarray | list | str | float | None, dtype_bytes: Num) -> Num:
    """Bits per weight: a row's quantisation's, else (no quantisation: None, or NaN from pandas) its dtype's."""
    if not isinstance(quant, list | np.ndarray):  # one value for every row
        return QUANT_BITS[quant] if isinstance(quant, str) else 8 * dtype_bytes
    bits = np.array([QUANT_BITS.get(q, np.nan) if isinstance(q, str) else np.nan for q in quant])
    return np.where(np.isnan(bits), 8 * np.asarray(dtype_bytes, dtype=np.float64), bits)


def _attended(layers: Num, n: Num, c: Num, window: Num) -> Num:
    """layers x the keys each query attends to, summed; nothing to sum where no layer is of this kind."""
    return 0.0 if isinstance(layers, float) and layers == 0 else layers * keys_sum(n, c, window)


def _where(condition: bool | np.ndarray, a: Num, b: Num) -> Num:
    """np.where that keeps a shared scalar a scalar."""
    return (a if condition else b) if isinstance(condition, bool) else np.where(condition, a, b)


def build(rows: Mapping[str, np.ndarray | list | float | str]) -> np.ndarray:
    """[rows, len(FEATURES)] float64 from columns named in INPUT_COLUMNS (window 0: none), one row
    per chunk size. Any other column may be a scalar shared by every row: the service passes one
    config and its candidate chunk sizes."""
    f = {
        name: _numbers(rows[name])
        for name in INPUT_COLUMNS
        if name not in ("layout", "dtype", "attn_impl", "backend", "quant")
    }
    n, c = f["context_length"], np.minimum(np.atleast_1d(f["chunk_size"]), f["context_length"])  # [rows]
    layers, heads, kv, hd = f["num_layers"], f["num_heads"], f["num_kv_heads"], f["head_dim"]
    dtype_bytes = _codes(rows["dtype"], DTYPE_BYTES)
    weight_bits = _weight_bits(rows.get("quant"), dtype_bytes)
    has_window = f["window"] > 0
    window = _where(has_window, f["window"], np.inf)
    every = f["global_every"]
    local_layers = _where(has_window, _where(every > 0, layers - np.floor(layers / np.maximum(every, 1)), layers), 0.0)
    global_layers = layers - local_layers

    m = chunk_count(n, c)
    d, ff = f["hidden_size"], f["intermediate_size"]
    linear = linear_flops(n, layers, d, heads, kv, hd, ff)
    # global tokens: seen by the queries past the window, about half of those on average
    outside = f["global_tokens"] * np.maximum(n - np.minimum(window, n), 0) / 2
    attended = _attended(local_layers, n, c, window) + local_layers * outside + _attended(global_layers, n, c, np.inf)
    # the first chunk has no history: where it fits the window, PyTorch's kernels but eager take the
    # plain causal path and score its triangle, c(c + 1)/2 of its c^2 (chunk_features' `plain`); a
    # dense kernel scores a later chunk's whole rectangle, and a first one longer than the window (one
    # shot under a window) builds a mask. llama.cpp without flash attention scores every cached key
    # for each batch (docs/backends.md), the first batch too. (`split` computes only the keys each
    # query sees whatever the chunk: the per-chunk model prices that, not these plan terms)
    attn_impl, backend = _codes(rows["attn_impl"], ATTN_CODES), _codes(rows["backend"], BACKEND_CODES)
    every_key = (backend == BACKEND_CODES["llama.cpp"]) & (attn_impl == ATTN_CODES["masked"])
    plain = _where(attn_impl == ATTN_CODES["eager"], 0.0, _where(every_key, 0.0, 1.0))
    attended = attended - plain * (local_layers * (c <= window) + global_layers) * c * (c - 1) / 2
    attention = 4 * heads * hd * attended
    kept = _where(has_window, np.minimum(n, window + f["sinks"] + f["global_tokens"]), n)
    kv_bytes = 2 * layers * kv * hd * kept * dtype_bytes
    keys_last = np.minimum(n, _where(has_window, window, n) + c)
    score_bytes = heads * c * keys_last * 4  # one chunk's score matrix, the attention working set
    gflops = f["matmul_gflops"]
    # fmt: off
    out = {
        "context_length": n, "chunk_size": c, "num_chunks": m, "last_chunk": n - (m - 1) * c,
        "chunk_over_context": c / n, "window": _where(has_window, f["window"], 0.0), "has_window": has_window,
        "layout": _codes(rows["layout"], LAYOUT_CODES), "sinks": f["sinks"], "global_tokens": f["global_tokens"],
        "local_fraction": local_layers / layers,
        "num_layers": layers, "hidden_size": d, "num_heads": heads, "num_kv_heads": kv, "head_dim": hd,
        "intermediate_size": ff, "vocab_size": f["vocab_size"], "parameters": f["parameters"],
        "dtype_bytes": dtype_bytes, "weight_bits": weight_bits, "attn_impl": attn_impl,
        "backend": backend,
        "threads": f["threads"], "matmul_gflops": gflops, "bandwidth_gbs": f["bandwidth_gbs"],
        "call_overhead_ms": f["call_overhead_ms"], "cores": f["cores"],
        "l2_cache_mib": f["l2_cache_bytes"] / 2**20, "l3_cache_mib": f["l3_cache_bytes"] / 2**20,
        "linear_gflop": linear / 1e9, "attention_gflop": attention / 1e9, "kv_mib": kv_bytes / 2**20,
        "chunk_score_mib": score_bytes / 2**20, "compute_ms": (linear + attention) / (gflops * 1e9) * 1e3,
        "overhead_ms": (m + 1) * layers * f["call_overhead_ms"],
    }
    # fmt: on
    x = np.empty((len(c), len(FEATURES)))
    for j, name in enumerate(FEATURES):
        x[:, j] = out[name]  # shared scalars broadcast down the column
    return x


def prefill_flops(rows: Mapping[str, np.ndarray | list | float | str]) -> np.ndarray:
    """[rows] the prompt's own FLOPs whatever its chunking: projections and MLP over every token,
    and each query against the keys before it within the window, and itself (what one-token chunks
    attend); what an achieved GFLOP/s divides (bench/efficiency.py, `chunkpilot prefill`). `rows`:
    INPUT_COLUMNS as `build` takes them, the chunk size aside."""
    n = np.atleast_1d(_numbers(rows["context_length"]))
    x = build({**rows, "chunk_size": np.ones(len(n)), "matmul_gflops": 1.0})  # FLOPs: whatever the machine
    return (x[:, _LINEAR] + x[:, _ATTENTION]) * 1e9


def base_log_ms(x: np.ndarray) -> np.ndarray:
    """The analytic estimate the model corrects: log(compute + per-call overhead + 1 ms)."""
    return np.log(x[:, _COMPUTE] + x[:, _OVERHEAD] + 1.0)


def floor_ms(row: Mapping[str, Any]) -> float:
    """The least analytic estimate (exp of `base_log_ms`) of any chunk size for the prompt `row` (one
    config: INPUT_COLUMNS as `build` takes them, less the chunk size): its projections and MLP
    alone, and two calls a layer (one chunk and the first decode step at the fewest), from the
    request's own numbers, no feature row built. 0 where the machine has no matmul speed to divide by."""
    gflops = float(row["matmul_gflops"])
    if not gflops > 0:
        return 0.0
    layers = float(row["num_layers"])
    shape = (row[name] for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"))
    linear = linear_flops(float(row["context_length"]), layers, *map(float, shape))
    return linear / (gflops * 1e9) * 1e3 + 2 * layers * float(row["call_overhead_ms"]) + 1.0


_COMPUTE, _OVERHEAD = FEATURES.index("compute_ms"), FEATURES.index("overhead_ms")
_LINEAR, _ATTENTION = FEATURES.index("linear_gflop"), FEATURES.index("attention_gflop")
