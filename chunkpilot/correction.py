"""This machine, learnt from its own prefills without a retrain: a shrunk residual on the per-chunk
cost.

Every `auto` prefill reports each chunk's ms. Its residual against the served cost model (log
measured - log predicted, the members' mean) is kept per kind of request (the same model shape,
machine descriptors, dtype, threads, kernel and window regime: window on or off and its layout,
but any length or window size) and, within a kind, per quarter octave of the window and of the
chunk's query tokens: which sizes the global model misjudges depends on the keys a chunk attends,
so a size learnt under one window does not move that size under another (a demo's 768-token
chunks learnt under a 1,024 window made 1,024 win under a 2,048 one, where it was 13% slower). A prefill counts
once per bucket (its chunks' mean residual), and each level is shrunk towards the one above it with
PRIOR prefills' worth of weight: the kind's mean towards 0 (the global model), a size bucket's towards
its kind's mean. So one prefill moves a prediction a third of the way, a dozen almost all of it, and
sizes never measured here still move with the machine's level.

Single prefills are noisy (a few percent to 20% here), so a size learnt from one or two of them is
not known to the few percent that separate neighbouring sizes. `difference_variance` states the
noise the correction brings in: a bucket learnt from n prefills moves by n / (n + PRIOR) of their
mean, which carries n sigma^2 / (n + PRIOR)^2 of their variance (none where it learnt nothing: there
the members' spread is the global model's own uncertainty), with sigma^2 the pooled spread of a
bucket's prefills around their mean (NOISE as a prior worth NOISE_DOF prefills until this machine
has measured its own). The chooser adds it to the members' disagreement before it overturns the
anchor. numpy only: the service applies it on every answer.

Bounded, whoever reports: a chunk's residual is clipped to +-CLIP before it counts (a winsorised
mean, so one absurd outcome weighs no more than a merely bad one), and since every level is a
shrunk mean of clipped values, K prefills of one kind move any chunk's log-ms by at most
CLIP * (1 - (PRIOR / (K + PRIOR))**2) (the kind's mean moves by up to CLIP * K / (K + PRIOR), and
the size bucket, all K of them alike, the rest of the way towards CLIP but for its own shrinkage):
a prediction's TTFT by less than a factor exp(CLIP) = 1.5 however many outcomes one source sends
(tests/test_attacks.py). A machine whose level is off by more than that
still ranks its sizes right: the level moves every size alike. Safe under threads without making
decisions wait: what it learnt is an immutable snapshot that each learn replaces whole (the service
learns in its thread pool while other threads decide).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from .contract import SHAPE_COLUMNS, ChunkRequest
from .features import FEATURES, RUNTIME

PRIOR = 2.0
CLIP = math.log(1.5)  # the largest log residual one chunk may teach
NOISE, NOISE_DOF = 0.1, 2.0  # a single prefill's log-ms spread before this machine shows its own (+-10%)
KIND = ["has_window", "layout", *SHAPE_COLUMNS, *RUNTIME]
_KIND = [FEATURES.index(name) for name in KIND]


_SHAPE = slice(KIND.index(SHAPE_COLUMNS[0]), KIND.index(SHAPE_COLUMNS[-1]) + 1)  # a kind's shape


def kinds(config: np.ndarray) -> list[tuple[float, ...]]:
    """Each row's kind of request (rounded so that one descriptor measured twice is one kind)."""
    return [tuple(row) for row in np.round(config[:, _KIND], 4).tolist()]


_W, _C = FEATURES.index("window"), FEATURES.index("chunk_size")


def quarter_octave(tokens: ArrayLike) -> np.ndarray:
    """A quarter octave of tokens, elementwise (0 for none: a window of 0 is no window): lengths this
    close are alike, to the correction and to exploring (predictor.explore: one kind of request)."""
    return np.round(4 * np.log2(np.maximum(tokens, 1))).astype(int)


def neighbourhood(request: ChunkRequest) -> str:
    """Its kind and the quarter octave of its length, as a key: the requests exploring counts as one
    (predictor.explore), whose measured sizes teach each other."""
    return f"{int(quarter_octave(request.context_length))}|{request.kind()}"


@dataclass(frozen=True)
class Learnt:
    """What the correction has learnt, never changed once published: a decision reads one snapshot
    whole while a learn builds the next."""

    prefills: int = 0
    level: dict[tuple, tuple[float, float]] = field(default_factory=dict)  # kind -> (sum, count)
    sized: dict[tuple, tuple[float, float]] = field(default_factory=dict)  # (kind, window, size) -> (sum, count)
    squares: dict[tuple, float] = field(default_factory=dict)  # per sized bucket


@dataclass
class Correction:
    prior: float = PRIOR
    learnt: Learnt = field(default_factory=Learnt)
    _writer: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one learn at a time

    @property
    def prefills(self) -> int:
        return self.learnt.prefills

    def learnt_shape(self, shape: tuple[float, ...]) -> bool:
        """Whether a prefill of a model of this shape (its SHAPE_COLUMNS) taught it."""
        return any(kind[_SHAPE] == shape for kind in self.learnt.level)

    def learn(self, config: np.ndarray, q: np.ndarray, residual: np.ndarray) -> None:
        """One prefill: its chunks' config rows [chunks, FEATURES], query tokens and log residuals
        (each clipped to +-CLIP). Builds the next snapshot from copies, then publishes it."""
        residual = np.clip(residual, -CLIP, CLIP)
        kind = kinds(config[:1])[0]
        window = int(quarter_octave(config[:1, _W])[0])
        buckets = quarter_octave(q)
        with self._writer:
            old = self.learnt
            level, sized, squares = dict(old.level), dict(old.sized), dict(old.squares)
            total, count = level.get(kind, (0.0, 0.0))
            level[kind] = (total + float(residual.mean()), count + 1)
            for b in np.unique(buckets).tolist():
                key, r = (kind, window, b), float(residual[buckets == b].mean())
                total, count = sized.get(key, (0.0, 0.0))
                sized[key] = (total + r, count + 1)
                squares[key] = squares.get(key, 0.0) + r * r
            self.learnt = Learnt(old.prefills + 1, level, sized, squares)

    def offsets(self, config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
        """[chunks] the log-ms correction of each chunk (0 where this machine has no prefill of its kind)."""
        learnt = self.learnt
        out = np.zeros(len(q))
        if not learnt.prefills:
            return out
        buckets, windows = quarter_octave(q).tolist(), quarter_octave(config[:, _W]).tolist()
        for i, (kind, w, b) in enumerate(zip(kinds(config), windows, buckets, strict=True)):
            total, count = learnt.level.get(kind, (0.0, 0.0))
            mean = total / (count + self.prior)
            total, count = learnt.sized.get((kind, w, b), (0.0, 0.0))
            out[i] = mean + (total - count * mean) / (count + self.prior)
        return out

    def noise(self, learnt: Learnt | None = None) -> float:
        """sigma^2: a single prefill's variance around its bucket's mean, pooled over the buckets."""
        learnt = learnt or self.learnt
        ss = sum(learnt.squares[key] - total * total / count for key, (total, count) in learnt.sized.items())
        dof = sum(count - 1 for _, count in learnt.sized.values())
        return (ss + NOISE_DOF * NOISE**2) / (dof + NOISE_DOF)

    def difference_variance(self, x: np.ndarray) -> np.ndarray:
        """[candidates, candidates] the variance the correction's noise adds to the difference
        between two uniform plans of one request, `x` [candidates, FEATURES]: the sum of their size
        buckets' where the buckets differ (a plan's chunks share its size's bucket, but the last);
        0 for a kind of request the correction has not learnt."""
        learnt = self.learnt
        out = np.zeros((len(x), len(x)))
        kind = kinds(x[:1])[0]
        if not learnt.prefills or kind not in learnt.level:
            return out
        window, buckets = int(quarter_octave(x[:1, _W])[0]), quarter_octave(x[:, _C]).tolist()
        counts = np.array([learnt.sized.get((kind, window, b), (0.0, 0.0))[1] for b in buckets])
        var = self.noise(learnt) * counts / (counts + self.prior) ** 2  # [candidates]
        out = var[:, None] + var[None, :]
        out[np.equal.outer(buckets, buckets)] = 0.0
        return out
