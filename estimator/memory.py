"""The memory side of a decision: what one prefill at a chunk size adds at its peak above the loaded
model (the rows' `prefill_memory_bytes`: engine/memory.py, llama.cpp's own buffers), predicted for
every candidate so that a request's `memory_budget_mb` can be kept.

An analytic model with fitted coefficients: the peak is a sum of the buffers a prefill holds at
once, each a product of the shape, the chunk and the dtype (`terms`): the KV cache (and, where it
grows by concatenation, as transformers' does, its old copy while a chunk appends), a chunk's
hidden-state and MLP activations, its attention scores and mask, its logits, and a constant, taken
at the chunk and phase where the peak falls (a buffer freed before another exists is not summed with
it: llama.cpp's scores and logits, a PyTorch layer's attention and MLP). One non-negative fit per
backend and kernel (their allocators and kernels keep different buffers), on the relative error (a
budget is a ratio), and one over all rows for a backend or kernel without rows. Its safety margins
are fitted too, one per backend and kernel: the 99th percentile of how far that kind's held-out
configs' measured peaks rose above their predictions (one config held out at a time), so that a
budgeted choice fits about 99 times in 100 where the model was judged.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import copy
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from scipy.optimize import nnls

from chunkpilot.features import ATTN_CODES, BACKEND_CODES, FEATURES, LAYOUT_CODES, shift_in_one_call

MIB = 2**20
TERMS = (
    *("constant", "kv", "kv_copy", "hidden", "mlp", "scores", "mask", "logits"),
    *("kv_expanded", "graph", "prepended", "reordered", "blocks"),
)
LLAMA_CPP, TRANSFORMERS = BACKEND_CODES["llama.cpp"], BACKEND_CODES["transformers"]
BLOCKWISE = [ATTN_CODES["split"], ATTN_CODES["flash"]]  # kernels that score a block of keys at a time
PAD = 256  # llama.cpp rounds its batch and its cells up to this (engine/backends.py)
MIN_MARGIN = 0.05  # never promise tighter than this, however well the held-out configs fit
OWN_FIT = 3  # configs a backend and kernel needs for coefficients of its own (else the pooled fit's)
_col = {name: i for i, name in enumerate(FEATURES)}
_index = {name: i for i, name in enumerate(TERMS)}
# llama.cpp's context holds its KV cells, its mask and the larger of its graph's two phases (a
# batch's scores, every head, or its logits): its reported buffers are made of these
LLAMA_CPP_TERMS = np.array([name in ("kv", "mask", "graph") for name in TERMS], dtype=float)
# a PyTorch layer frees its attention's buffers before its MLP's (gate, up and their product) exist;
# the bundled engine's masks, built once a step for every layer (engine/attention.py: StepMasks),
# stay through both phases, where generate's mask fits best as its attention's (held-out p95 10.5%
# against 11.8% as held)
ATTENTION = [_index[n] for n in ("scores", "kv_expanded", "prepended", "reordered", "blocks")]
MLP, MASK = [_index["mlp"]], [_index["mask"]]
HELD = [_index[n] for n in ("constant", "kv", "hidden", "logits")]


# the config's columns `_at` reads: one value for all of a request's candidates
_SHARED = (
    *("backend", "attn_impl", "layout", "window", "local_fraction", "sinks", "global_tokens", "dtype_bytes"),
    *("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size"),
)
_SHARED_COLUMNS = [_col[name] for name in _SHARED]


class _Columns:
    """x's columns by feature name, each taken when asked for (a dozen of FEATURES' forty). Where
    every row shares its config (a request's candidates), the config's columns are numpy scalars
    (whose comparisons, unlike Python's, `~` negates): `_at`'s arithmetic on them is then scalar,
    not a few dozen small-array calls on a decision's hot path."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        config = x[:, _SHARED_COLUMNS]
        one = len(x) > 0 and bool((config == config[:1]).all())
        self.shared: dict[str, np.float64] = dict(zip(_SHARED, config[0], strict=True)) if one else {}

    def __getitem__(self, name: str) -> np.ndarray | np.float64:
        found = self.shared.get(name)
        return self.x[:, _col[name]] if found is None else found

    def twice(self) -> _Columns:
        """These rows, then the same rows again: `_two_chunks` prices its two chunks in one pass."""
        doubled = copy(self)
        doubled.x = np.concatenate([self.x, self.x])
        return doubled


def terms(x: np.ndarray) -> np.ndarray:
    """[rows, TERMS] MiB of each buffer a prefill holds at its peak, up to a coefficient each; `x`
    [rows, FEATURES] (chunkpilot.features.build). Two chunks can hold the peak: the last full one
    and the partial one after it, which sees every key. llama.cpp sizes its buffers once, for a
    batch of the largest chunk against every cell (both rounded up to PAD); in PyTorch the peak is
    the one chunk and phase (attention or MLP) that holds the most bytes, against a cache the
    bundled engine allocates for the whole prompt and transformers grows by concatenation."""
    backend = x[:, _col["backend"]]
    if len(x) and (backend == backend[0]).all():  # a request's candidates: one backend's
        return _held_by(backend[0])(_Columns(x))
    out = np.empty((len(x), len(TERMS)))
    for code in np.unique(backend):
        rows = backend == code
        out[rows] = _held_by(code)(_Columns(x[rows]))
    return out


def _held_by(backend: float) -> Callable[[_Columns], np.ndarray]:
    """How a backend's buffers are held: llama.cpp's sized once, PyTorch's chunk by chunk against
    a cache grown by concatenation (transformers) or allocated for the whole prompt (the bundled engine)."""
    if backend == LLAMA_CPP:
        return _sized_once
    return partial(_chunked, growing=backend == TRANSFORMERS)


def _sized_once(col: _Columns) -> np.ndarray:
    """llama.cpp: its graph's buffers for a batch of the largest chunk against every cell, both
    rounded up to PAD, holding the scores or the logits, the larger."""
    n = np.ceil((col["context_length"] + 1) / PAD) * PAD
    c = np.minimum(np.ceil(col["chunk_size"] / PAD) * PAD, n)
    sized = _at(col, c, n, n, np.zeros(len(n), bool))
    sized[:, _index["graph"]] = np.maximum(sized[:, _index["scores"]], sized[:, _index["logits"]])
    return sized * LLAMA_CPP_TERMS


def _chunked(col: _Columns, growing: bool) -> np.ndarray:
    """PyTorch: the chunk and phase holding the most, against a cache allocated for the whole prompt
    (the bundled engine) or grown by concatenation (transformers)."""
    return _at_peak(*_two_chunks(col, growing), mask_held=not growing)


def _two_chunks(col: _Columns, growing: bool) -> tuple[np.ndarray, np.ndarray]:
    """[rows, TERMS] at the last full chunk and at the partial one after it (zeros where none)."""
    n, c = col["context_length"], np.minimum(col["chunk_size"], col["context_length"])
    full = np.floor(n / c)
    rest = n - full * c
    # one pass of `_at` over both chunks: its few dozen array operations once, not twice, on the
    # first decision of a kind
    both = _at(
        col.twice(),
        np.concatenate([c, np.maximum(rest, 1)]),
        np.concatenate([full * c, n]),
        np.concatenate([full * c if growing else n, n]),
        np.concatenate([full == 1, np.zeros(len(n), bool)]),
    )
    last_full, last_part = both[: len(n)], both[len(n) :]
    return last_full, np.where((rest > 0)[:, None], last_part, 0)


def _at(col: _Columns, c: np.ndarray, keys: np.ndarray, cached: np.ndarray, first: np.ndarray) -> np.ndarray:
    """[rows, TERMS] while a chunk of `c` tokens attends to `keys` keys with `cached` positions in
    the cache (`first`: the prompt's first chunk, which needs no mask in PyTorch: causal)."""
    llama, growing = col["backend"] == LLAMA_CPP, col["backend"] == TRANSFORMERS
    window, local, extra = col["window"], col["local_fraction"], col["sinks"] + col["global_tokens"]
    ring = col["layout"] == LAYOUT_CODES["ring"]
    # a local layer's cells: a ring's two windows of slots (engine/kv_cache.py); a shift's window
    # and chunk, twice over in the bundled engine's buffer of two (transformers keeps a view of
    # the window in the concatenation, which holds the whole); its keys: the window and the chunk
    shift = np.where(llama | growing, window + c, 2 * (window + c))
    kept = np.where(window > 0, np.where(ring, 2 * window, np.minimum(cached, shift)) + extra, cached)
    seen = np.where(window > 0, np.where(ring, 2 * window, np.minimum(keys, window + c)) + extra, keys)
    cells = local * kept + (1 - local) * cached
    width = col["dtype_bytes"] / MIB
    kv = 2 * col["num_layers"] * col["num_kv_heads"] * col["head_dim"] * cells * width
    widest = np.where(local < 1, keys, seen)  # the widest layer's keys
    masked_first = llama | (window > 0) | ~first  # a first chunk without a window: causal in PyTorch
    pairs = np.where(masked_first, c * widest, 0)
    # split and flash score a block of keys at a time, and so does PyTorch's sdpa under masked (its
    # CPU flash kernel, given a mask); split needs no mask (flash one of f16) but for a shift
    # window's chunk of half of it or less, attended in one call with the step's mask
    attn = col["attn_impl"]
    blockwise = (attn == BLOCKWISE[0]) | (attn == BLOCKWISE[1])  # np.isin: ten times the cost
    scored = ~blockwise & (llama | (attn != ATTN_CODES["masked"]))
    split = attn == ATTN_CODES["split"]
    one_call = split & (col["layout"] == LAYOUT_CODES["shift"]) & (window > 0) & shift_in_one_call(c, window)
    # the bundled engine's masks, one per layer kind for the whole step: none for a first chunk that
    # is plain causal (engine/attention.py: StepMasks), the window's only where split makes one
    bundled_causal = ~llama & ~growing & first & (attn != ATTN_CODES["eager"]) & ((window == 0) | (c <= window))
    mask_keys = np.where(one_call, seen, widest + ((local < 1) & (window > 0) & ~growing) * seen)
    mask_pairs = np.where(masked_first & ~(split & ~one_call) & ~bundled_causal, c * mask_keys, 0)
    gqa = col["num_kv_heads"] < col["num_heads"]
    # split's blocks of a query, each output held until merged (engine/attention.py): its tile's own
    # keys, earlier keys, a window's anti-causal edge, the sinks and global tokens; and the merge
    earlier = (keys > c) | ((window > 0) & (c > window))
    blocks = 1 + earlier + ((window > 0) & earlier) + (extra > 0)
    blocks = np.where(split & ~one_call, blocks + (blocks > 1), 0)
    tile = np.where(window > 0, np.minimum(c, window), c)
    return np.stack(
        [
            np.ones(len(c)),
            kv,
            growing * kv * (1 - c / np.maximum(keys, 1)),  # a concatenating cache's old copy
            c * col["hidden_size"] * width,
            c * col["intermediate_size"] * width,
            4 * col["num_heads"] * pairs * scored / MIB,  # a chunk's scores, every head
            4 * mask_pairs / MIB,  # its masks, one for all heads
            4 * np.where(llama, c, 1) * col["vocab_size"] / MIB,  # PyTorch keeps the last position's only
            # one layer's keys and values repeated to every query head (GQA: transformers' repeat_kv;
            # split repeats only a causal block's: a tile's own keys)
            2 * gqa * col["num_heads"] * col["head_dim"] * np.where(split & ~one_call, tile, widest) * width,
            np.zeros(len(c)),  # llama.cpp's larger phase (terms)
            # a window layer's keys and values copied once more where its sinks or global tokens are
            # put before them (engine/kv_cache.py: prepend), one layer's as it attends
            2 * (extra > 0) * col["num_kv_heads"] * col["head_dim"] * np.minimum(seen, keys + extra) * width,
            # split's copy of a ring layer's keys and values in position order, one layer's as it attends
            2 * (split & ring) * col["num_kv_heads"] * col["head_dim"] * np.minimum(2 * window, keys) * width,
            4 * blocks * c * col["num_heads"] * col["head_dim"] / MIB,  # fp32, each [B, H, q, D]
        ],
        axis=1,
    )


def _at_peak(last_full: np.ndarray, last_part: np.ndarray, mask_held: bool) -> np.ndarray:
    """Each row's terms of the chunk and phase holding the most bytes (each buffer counted once,
    the MLP's three), the other phase's terms zeroed; the mask held through both or the attention's."""
    in_attention, kept = (_ATTENTION_HELD, _KEEP_HELD) if mask_held else (_ATTENTION_ALONE, _KEEP_ALONE)
    phases, most = [], []
    for t in (last_full, last_part):
        attention, mlp = t @ in_attention, t @ _MLP_TIMES_3
        phases.append(t * np.where((attention >= mlp)[:, None], kept[0], kept[1]))
        most.append(t @ kept[2] + np.maximum(attention, mlp))
    return np.where((most[1] > most[0])[:, None], phases[1], phases[0])  # a tie: the last full chunk


def _phase_vectors(in_attention: list[int], held: list[int]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """(the attention's terms, (the terms kept in the attention phase, in the MLP phase, held in both))
    as 0/1 vectors over TERMS: `_at_peak`'s sums are products with them."""
    attention, held_vector = np.zeros(len(TERMS)), np.zeros(len(TERMS))
    attention[in_attention], held_vector[held] = 1.0, 1.0
    keep_attention, keep_mlp = np.ones(len(TERMS)), np.ones(len(TERMS))
    keep_attention[MLP], keep_mlp[in_attention] = 0.0, 0.0
    return attention, (keep_attention, keep_mlp, held_vector)


_MLP_TIMES_3 = np.zeros(len(TERMS))
_MLP_TIMES_3[MLP] = 3.0
_ATTENTION_HELD, _KEEP_HELD = _phase_vectors(ATTENTION, HELD + MASK)
_ATTENTION_ALONE, _KEEP_ALONE = _phase_vectors(ATTENTION + MASK, HELD)


def _kind(x: np.ndarray) -> list[str]:
    """[rows] each row's "backend/kernel" codes (a request's rows share theirs: named once)."""
    codes = x[:, [_col["backend"], _col["attn_impl"]]].astype(int)
    if len(codes) and (codes == codes[0]).all():
        return [f"{codes[0, 0]}/{codes[0, 1]}"] * len(x)
    return [f"{b}/{k}" for b, k in codes.tolist()]


def _backend(kind: str) -> str:
    """The backend's code of a kind's "backend/kernel" codes."""
    return kind.split("/")[0]


def _fit(t: np.ndarray, mib: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative error."""
    return nnls(t / mib[:, None], np.ones(len(mib)))[0]


@dataclass
class MemoryModel:
    # per term, by "backend/kernel" codes, and by "backend" for a kind with too few configs of its own
    coefficients: dict[str, list[float]] = field(default_factory=dict)
    pooled: list[float] = field(default_factory=list)  # over every row: a kind without rows
    margins: dict[str, float] = field(
        default_factory=dict
    )  # per kind: a predicted peak is kept within budget / (1 + it)
    margin: float = MIN_MARGIN  # a kind without rows

    def fit(
        self, x: np.ndarray, peak_bytes: np.ndarray, configs: np.ndarray, rise: np.ndarray | None = None
    ) -> MemoryModel:
        """Fitted on rows `x` [rows, FEATURES] with their measured peaks (bytes > 0) and configs (a
        config's peak is one on every machine: its rows of two machines are one config); the margin
        from each config held out in turn (`rise`: `held_out` of these very rows, where the caller
        has it already)."""
        mib, t, kinds = peak_bytes / MIB, terms(x), np.array(_kind(x))
        if len(np.unique(configs)) < 2:
            raise ValueError("a memory model needs measured peaks of two configs at least (one to hold out)")
        self.pooled = _fit(t, mib).tolist()
        backends = np.array([_backend(k) for k in kinds])
        self.coefficients = {
            key: _fit(t[m], mib[m]).tolist()
            for column in (kinds, backends)
            for key in sorted(set(column))
            if len(np.unique(configs[m := column == key])) >= OWN_FIT
        }
        rise = held_out(x, peak_bytes, configs) if rise is None else rise
        self.margin = max(MIN_MARGIN, float(np.quantile(rise, 0.99)))
        self.margins = {k: max(MIN_MARGIN, float(np.quantile(rise[kinds == k], 0.99))) for k in sorted(set(kinds))}
        return self

    def margin_of(self, x: np.ndarray) -> np.ndarray:
        """[rows] the safety margin of each row's backend and kernel."""
        return np.array([self.margins.get(k, self.margin) for k in _kind(x)])

    def predict_bytes(self, x: np.ndarray) -> np.ndarray:
        """[rows] predicted peak bytes above the loaded model."""
        t, kinds = terms(x), _kind(x)
        if len(set(kinds)) == 1:  # a request's candidates: one kind, one fit
            return t @ np.asarray(self._coefficients(kinds[0])) * MIB
        coef = np.array([self._coefficients(k) for k in kinds])
        return np.einsum("ij,ij->i", t, coef) * MIB

    def _coefficients(self, kind: str) -> list[float]:
        """A kind's own fit, else its backend's (its kernels share most buffers), else the pooled one."""
        return self.coefficients.get(kind) or self.coefficients.get(_backend(kind)) or self.pooled

    def fits(self, x: np.ndarray, budget_mb: float) -> np.ndarray:
        """[rows] whether each predicted peak, raised by its margin, stays within `budget_mb`."""
        return within_budget(self.predict_bytes(x) / MIB, self.margin_of(x), budget_mb)

    def save(self) -> dict:
        return {
            "coefficients": self.coefficients,
            "pooled": self.pooled,
            "margins": self.margins,
            "margin": self.margin,
        }

    @classmethod
    def load(cls, saved: dict) -> MemoryModel:
        return cls(saved["coefficients"], saved["pooled"], saved["margins"], saved["margin"])


def held_out(x: np.ndarray, peak_bytes: np.ndarray, configs: np.ndarray) -> np.ndarray:
    """[rows] measured / predicted - 1, each config predicted by a model fitted without it, from the
    rows it would be served from: its kind's if the kind has OWN_FIT configs, its own among them,
    else its backend's if that has, else every row's."""
    mib, t, kinds = peak_bytes / MIB, terms(x), np.array(_kind(x))
    backends = np.array([_backend(k) for k in kinds])
    out = np.empty(len(x))
    for config in np.unique(configs):
        test = configs == config
        kind = kinds == kinds[test][0]
        backend = backends == backends[test][0]
        every = np.ones(len(x), bool)
        served = next((m for m in (kind, backend) if len(np.unique(configs[m])) >= OWN_FIT), every)
        train = served & ~test
        out[test] = mib[test] / np.maximum(t[test] @ _fit(t[train], mib[train]), 1e-9) - 1
    return out


def within_budget(peak_mb: np.ndarray, margin: float | np.ndarray, budget_mb: float) -> np.ndarray:
    """Whether each predicted peak, raised by its safety margin, stays within the budget: the one
    rule a budgeted choice keeps."""
    return peak_mb * (1 + margin) <= budget_mb
