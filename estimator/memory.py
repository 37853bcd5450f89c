"""The memory side of a decision: what one prefill at a chunk size adds at its peak above the loaded
model (the rows' `prefill_memory_bytes`: engine/memory.py, llama.cpp's own buffers), predicted for
every candidate so that a request's `memory_budget_mb` can be kept.

An analytic model with fitted coefficients: the peak is a sum of the buffers a prefill holds at
once, each a product of the shape, the chunk and the dtype (`terms`): the KV cache (and, where it
grows by concatenation, as transformers' does, its old copy while a chunk appends), a chunk's
hidden-state and MLP activations, its attention scores and its logits, and a constant. A buffer
whose size is known outright keeps a coefficient of 1 (KNOWN: a bf16 model's vocabulary weight,
repacked while its matmul runs: fitted freely, a kind with one bf16 config held out had nothing to
fit it on, and its peak came out 4x or a tenth of what it measured). One
non-negative fit per backend and kernel (their allocators and kernels keep different buffers), on
the relative error (a budget is a ratio), and one over all rows for a backend or kernel without
rows. Its safety margins are fitted too, one per backend and kernel: the 99th percentile of how
far that kind's held-out configs' measured peaks rose above their predictions (one config held out
at a time), so that a budgeted choice fits about 99 times in 100 where the model was judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from chunkpilot.features import BACKEND_CODES, FEATURES, LAYOUT_CODES

MIB = 2**20
TERMS = ("constant", "kv", "kv_copy", "hidden", "mlp", "scores", "mask", "logits", "repacked")
LLAMA_CPP = BACKEND_CODES["llama.cpp"]
PAD = 256  # llama.cpp rounds its batch and its cells up to this (engine/backends.py)
MIN_MARGIN = 0.05  # never promise tighter than this, however well the held-out configs fit
OWN_FIT = 3  # configs a backend and kernel needs for coefficients of its own (else the pooled fit's)
_col = {name: i for i, name in enumerate(FEATURES)}
# terms that are the buffer itself: coefficient 1, never fitted. The repacked weight is a CPU's
# (oneDNN's bf16 matmul); no row tells a GPU's bf16 peak apart yet (no feature names the device,
# and no GPU row has measured its peak): when one does, the term must be kept to CPU rows
KNOWN = ("repacked",)
_KNOWN = [TERMS.index(name) for name in KNOWN]
_FITTED = [i for i in range(len(TERMS)) if i not in _KNOWN]


def terms(x: np.ndarray) -> np.ndarray:
    """[rows, TERMS] MiB of each buffer a prefill holds at its peak, up to a coefficient each (1 for
    the KNOWN ones); `x`
    [rows, FEATURES] (chunkpilot.features.build). The KV cache keeps the whole prompt on global
    layers and, on local ones, two windows (ring) or the window and the chunk (shift), with the
    sinks and global tokens; llama.cpp
    sizes its batch and its cells up to PAD. A bf16 matmul on a CPU repacks its weight: the largest
    (the vocabulary's) is held twice while it runs."""
    col = _Columns(x)
    padded = col["backend"] == LLAMA_CPP
    n = np.where(padded, np.ceil((col["context_length"] + 1) / PAD) * PAD, col["context_length"])
    c = np.where(padded, np.ceil(col["chunk_size"] / PAD) * PAD, col["chunk_size"])
    window, local, extra = col["window"], col["local_fraction"], col["sinks"] + col["global_tokens"]
    ring = col["layout"] == LAYOUT_CODES["ring"]
    # a local layer's cells: a ring's two windows of slots (engine/kv_cache.py), a shift's window and chunk
    kept = np.where(window > 0, np.where(ring, 2 * window, np.minimum(n, window + c)) + extra, n)
    cells = local * kept + (1 - local) * n
    width = col["dtype_bytes"] / MIB
    kv = 2 * col["num_layers"] * col["num_kv_heads"] * col["head_dim"] * cells * width
    keys = np.where(local < 1, n, kept)  # the widest layer's keys
    out = np.stack(
        [
            np.ones(len(x)),
            kv,
            kv * (1 - col["chunk_size"] / np.maximum(col["context_length"], 1)),  # a concatenating cache's old copy
            c * col["hidden_size"] * width,
            c * col["intermediate_size"] * width,
            4 * col["num_heads"] * c * keys / MIB,  # a chunk's scores, every head
            4 * c * keys / MIB,  # its mask, one for all heads
            4 * c * col["vocab_size"] / MIB,
            (col["dtype_bytes"] == 2) * col["vocab_size"] * col["hidden_size"] * width,
        ],
        axis=1,
    )
    if padded.any():
        out[padded] *= LLAMA_CPP_TERMS  # its buffers are sized once, by the graph: no activations kept apart
    return out


class _Columns:
    """x's columns by feature name, each taken when asked for (a dozen of FEATURES' forty)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __getitem__(self, name: str) -> np.ndarray:
        return self.x[:, _col[name]]


# llama.cpp's context holds its KV cells, the largest chunk's scores and mask, and the logits of a
# batch: the terms its reported buffers are made of (the others would only fit noise)
LLAMA_CPP_TERMS = np.array([name in ("kv", "scores", "mask", "logits") for name in TERMS], dtype=float)


def _kind(x: np.ndarray) -> list[str]:
    """[rows] each row's "backend/kernel" codes (a request's rows share theirs: named once)."""
    codes = x[:, [_col["backend"], _col["attn_impl"]]].astype(int)
    if len(codes) and (codes == codes[0]).all():
        return [f"{codes[0, 0]}/{codes[0, 1]}"] * len(x)
    return [f"{b}/{k}" for b, k in codes.tolist()]


def _fit(t: np.ndarray, mib: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative error, the KNOWN terms' held at 1."""
    out = np.ones(len(TERMS))
    out[_FITTED] = nnls(t[:, _FITTED] / mib[:, None], 1 - t[:, _KNOWN].sum(1) / mib)[0]
    return out


@dataclass
class MemoryModel:
    coefficients: dict[str, list[float]] = field(default_factory=dict)  # "backend/kernel" codes -> per term
    pooled: list[float] = field(default_factory=list)  # over every row: a kind without rows
    margins: dict[str, float] = field(
        default_factory=dict
    )  # per kind: a predicted peak is kept within budget / (1 + it)
    margin: float = MIN_MARGIN  # a kind without rows

    def fit(
        self, x: np.ndarray, peak_bytes: np.ndarray, groups: np.ndarray, rise: np.ndarray | None = None
    ) -> MemoryModel:
        """Fitted on rows `x` [rows, FEATURES] with their measured peaks (bytes > 0) and config
        groups; the margin from each group held out in turn (`rise`: `held_out` of these very rows,
        where the caller has it already)."""
        mib, t, kinds = peak_bytes / MIB, terms(x), np.array(_kind(x))
        if len(np.unique(groups)) < 2:
            raise ValueError("a memory model needs measured peaks of two configs at least (one to hold out)")
        self.pooled = _fit(t, mib).tolist()
        self.coefficients = {
            k: _fit(t[kinds == k], mib[kinds == k]).tolist()
            for k in sorted(set(kinds))
            if len(np.unique(groups[kinds == k])) >= OWN_FIT
        }
        rise = held_out(x, peak_bytes, groups) if rise is None else rise
        self.margin = max(MIN_MARGIN, float(np.quantile(rise, 0.99)))
        self.margins = {k: max(MIN_MARGIN, float(np.quantile(rise[kinds == k], 0.99))) for k in sorted(set(kinds))}
        return self

    def margin_of(self, x: np.ndarray) -> np.ndarray:
        """[rows] the safety margin of each row's backend and kernel."""
        return np.array([self.margins.get(k, self.margin) for k in _kind(x)])

    def predict_bytes(self, x: np.ndarray) -> np.ndarray:
        """[rows] predicted peak bytes above the loaded model."""
        t, kinds = terms(x), _kind(x)
        if len(set(kinds)) == 1:  # a request's candidates: one kind, one fit (the same arithmetic)
            coef = np.broadcast_to(np.asarray(self.coefficients.get(kinds[0], self.pooled)), t.shape)
        else:
            coef = np.array([self.coefficients.get(k, self.pooled) for k in kinds])
        return np.einsum("ij,ij->i", t, coef) * MIB

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


def held_out(x: np.ndarray, peak_bytes: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """[rows] measured / predicted - 1, each config predicted by a model fitted without it (a
    kind with fewer than OWN_FIT configs, its own among them: by the pooled fit without it, as it
    is served)."""
    mib, t, kinds = peak_bytes / MIB, terms(x), np.array(_kind(x))
    out = np.empty(len(x))
    for g in np.unique(groups):
        test = groups == g
        same = (kinds == kinds[test][0]) & ~test
        own = len(np.unique(groups[same])) + 1 >= OWN_FIT  # as served: its own fit, else the pooled one
        coef = _fit(t[same], mib[same]) if own else _fit(t[~test], mib[~test])
        out[test] = mib[test] / np.maximum(t[test] @ coef, 1e-9) - 1
    return out


def within_budget(peak_mb: np.ndarray, margin: float | np.ndarray, budget_mb: float) -> np.ndarray:
    """Whether each predicted peak, raised by its safety margin, stays within the budget: the one
    rule a budgeted choice keeps."""
    return peak_mb * (1 + margin) <= budget_mb
