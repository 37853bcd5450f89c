"""Cost models: each candidate plan's TTFT predicted with its uncertainty.

A model predicts log TTFT (ms) of uniform plans, one feature row (chunkpilot.features) per
candidate size, as the members of an ensemble: [members, rows]. The members' spread is the
uncertainty the chooser (estimator.recipe) weighs a saving against. Implementations:

- PerChunk: LightGBM on each measured chunk's ms, given its query tokens q and the history h before
  it (chunkpilot.chunk_features). A plan's TTFT is the sum of its chunks (at most SAMPLED of them
  priced, the others interpolated), plus the first decode step (one token after the whole prompt)
  and tokenizing. One training row per chunk, a cost that
  composes across lengths, and schedules priced by the same numbers. Trains on rows with `chunk_ms`;
  the plans of a backend none of whose rows had them (stock `generate` shows no chunk boundaries,
  or a backend never profiled) are priced by a PerCandidate model fitted beside it on every row.
- PerCandidate: LightGBM on log TTFT per (config, size), the correction to the analytic estimate
  (features.base_log_ms). Trains on every row.
- Analytic: the peers' profiled closed form (vllm-ascend), least squares per model and machine.

Members differ by seed and by bagging rows and features. Fitting and predicting are numpy only (no
pandas, no torch), so the service and training share these very objects; `save` writes LightGBM's
text format (never a pickle) and `load` reads it back.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import lightgbm as lgb
import numpy as np

from chunkpilot.chunk_features import CONFIG_COLUMNS as _CONFIG  # what a chunk's cost depends on besides q, h
from chunkpilot.chunk_features import chunk_features
from chunkpilot.chunks import chunk_count
from chunkpilot.contract import SHAPE_COLUMNS, number
from chunkpilot.features import FEATURES, MONOTONE, RUNTIME, base_log_ms, history_sum, keys_sum
from estimator.forest import Forest

# 300 trees of 31 leaves: the held-out regret that smaller or slower forests were measured against
# is in docs/training.md, with its command
LGBM = {
    "num_boost_round": 300,
    "learning_rate": 0.1,
    "num_leaves": 31,
    "min_data_in_leaf": 5,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "feature_fraction": 0.8,
}
MEMBERS = 5
_N, _C, _B = FEATURES.index("context_length"), FEATURES.index("chunk_size"), FEATURES.index("backend")

# per chunk: (query tokens, history) -> an additive log-ms correction [chunks] (chunkpilot.correction)
Adjust = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Measured:
    """What a cost model is fitted on: one row per (config, size) with its feature row."""

    x: np.ndarray  # [rows, FEATURES]
    ttft_ms: np.ndarray  # [rows]
    tokenize_ms: np.ndarray  # [rows]
    chunk_ms: Sequence[np.ndarray | None]  # per row: each chunk's ms, None where not measured
    memory_bytes: np.ndarray | None = None  # [rows] the prefill's peak above the model, 0 where not measured
    configs: np.ndarray | None = None  # [rows] each row's config (its key: one peak memory on every machine)


def lgb_params(params: dict, seed: int) -> tuple[dict, int]:
    """(LightGBM's parameters for member `seed`, its number of rounds)."""
    merged = {**LGBM, **params}
    rounds = int(merged.pop("num_boost_round"))
    # one thread unless CHUNKPILOT_FIT_THREADS says otherwise: OpenMP threads spin-wait against any
    # other work (a service, a prefill) and then cost far more than they save; the demo, which trains
    # alone, uses its cores (a per-chunk fit on the shipped data: 5.1 s on one core, 3.7 s on two).
    # Predicting passes num_threads=1 itself (a few rows gain nothing from OpenMP).
    threads = number("CHUNKPILOT_FIT_THREADS", os.environ.get("CHUNKPILOT_FIT_THREADS", "1"), int, ge=1, le=256)
    # deterministic: the same rows and params give the same model (the promotion gate relies on it)
    fixed = {"num_threads": threads, "deterministic": True, "force_col_wise": True}
    return {"verbose": -1, **fixed, "seed": seed, "objective": "regression", **merged}, rounds


def expand(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every uniform plan's chunks: (row of `x` it belongs to, query tokens, history) per chunk."""
    n, c = x[:, _N], x[:, _C]  # the feature row's chunk is already cut to the context
    m = chunk_count(n, c).astype(int)
    owner = np.repeat(np.arange(len(n)), m)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(m) - m, m)  # chunk number within its plan
    h = k * c[owner]
    return owner, np.minimum(c[owner], n[owner] - h), h.astype(float)


SAMPLED = 4  # full chunks of a plan priced one by one; beyond that, this many and a linear interpolation


@functools.lru_cache(maxsize=4096)
def _interpolation(full: int, cut: bool) -> tuple[np.ndarray, np.ndarray]:
    """(numbers of a plan's chunks to price, their weights) so that the weighted sum of the costs
    of its `full` chunks equals the sum of the costs interpolated linearly between those chunks
    (exact where the cost is linear in the history, as attention's is): a 16k-token prompt in
    64-token chunks costs SAMPLED predictions, not 256. A last chunk `cut` short is priced on its
    own."""
    if full <= SAMPLED:
        picks, weights = list(range(full)), [1.0] * full
    else:  # SAMPLED chunks evenly spread, first and last among them (a step over 1: no two alike)
        picks = [round(i * (full - 1) / (SAMPLED - 1)) for i in range(SAMPLED)]
        # a segment of L chunks from one pick to the next (the next's own excluded) weighs chunk s
        # by 1 - s/L on its left end and s/L on its right: (L + 1)/2 and (L - 1)/2 in all
        weights = [0.0] * SAMPLED
        for j, span in enumerate(b - a for a, b in itertools.pairwise(picks)):
            weights[j] += (span + 1) / 2
            weights[j + 1] += (span - 1) / 2
        weights[-1] += 1.0
    if cut:
        picks, weights = [*picks, full], [*weights, 1.0]
    return np.array(picks, dtype=float), np.array(weights)


def priced_chunks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What pricing every uniform plan of `x` predicts: (row of `x`, query tokens, history, weight)
    per priced chunk, each plan's together, in the order of `x` (each has one at least)."""
    if not len(x):
        return np.zeros(0, dtype=int), np.zeros(0), np.zeros(0), np.zeros(0)
    n, c = x[:, _N], x[:, _C]
    full, rest = np.divmod(n, c)
    plans = [_interpolation(f, r > 0) for f, r in zip(full.astype(int).tolist(), rest.tolist(), strict=True)]
    owner = np.repeat(np.arange(len(x)), [len(k) for k, _ in plans])
    h = np.concatenate([k for k, _ in plans]) * c[owner]
    return owner, np.minimum(c[owner], n[owner] - h), h, np.concatenate([w for _, w in plans])


def _config_ids(config: np.ndarray) -> np.ndarray:
    """[rows] an id per distinct row of `config`; a request's rows are all one config, checked
    first (np.unique over rows costs a tenth of a millisecond)."""
    if len(config) and (config == config[0]).all():
        return np.zeros(len(config), dtype=np.int64)
    return np.unique(config, axis=0, return_inverse=True)[1].reshape(-1)


class CostModel(Protocol):
    kind: str
    params: dict  # LightGBM's, over LGBM
    size: int  # members

    def fit(self, data: Measured) -> None: ...

    def members(self, x: np.ndarray, adjust: Adjust | None = None) -> np.ndarray: ...

    def save(self, folder: Path) -> dict: ...

    def compile(self, cache: Path | None = None) -> None:
        """Predict with native code from now on (estimator.forest), read from or written to `cache`
        (None: the user's): the same numbers, faster."""


@dataclass
class PerChunk:
    params: dict = field(default_factory=dict)  # LightGBM's, over LGBM
    size: int = MEMBERS
    kind: str = "per-chunk"
    forest: Forest = field(default_factory=Forest, repr=False)
    tokenize_ms_per_token: float = 0.0
    timed: list[int] = field(default_factory=list)  # the backends' codes whose chunks were timed
    untimed: PerCandidate | None = None  # the other backends' plans, whole; fitted beside the forest

    def fit(self, data: Measured) -> None:
        timed = [i for i, ms in enumerate(data.chunk_ms) if ms is not None]
        if not timed:
            raise ValueError("chunk_ms: the per-chunk model needs rows with per-chunk times (dataset v2 or later)")
        x = data.x[timed]
        owner, q, h = expand(x)
        plans = [np.asarray(data.chunk_ms[i], dtype=float) for i in timed]
        measured = np.concatenate(plans)  # the same order
        # each chunk weighs its share of its plan's time: a plan's log-TTFT error is its chunks' errors
        # weighed so, and every plan weighs one whatever its chunks (unweighted, a 16k prompt in 64s
        # outweighed its one-shot plan 256 to 1, and one shot was priced 6% slower than 4096 where it
        # measured 5% faster: docs/training.md)
        share = np.concatenate([ms / ms.sum() for ms in plans])
        features = chunk_features(x[owner], q, h)
        target = np.log(measured) - features[:, -1]
        boosters = []
        for seed in range(self.size):
            params, rounds = lgb_params(self.params, seed)
            dataset = lgb.Dataset(features, target, weight=share)
            boosters.append(lgb.train(params, dataset, num_boost_round=rounds))
        self.forest = Forest(boosters)
        self.tokenize_ms_per_token = float(np.median(data.tokenize_ms[timed] / x[:, _N]))
        self.timed = sorted({int(b) for b in x[:, _B]})
        self.untimed = PerCandidate(self.params, self.size)
        self.untimed.fit(data)

    def chunk_log_ms(self, config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
        """[members, chunks]: each chunk's log ms; `config` [chunks, FEATURES] is its config row."""
        features = chunk_features(config, q, h)
        return self.forest.predict(features) + features[:, -1]

    def members(self, x: np.ndarray, adjust: Adjust | None = None) -> np.ndarray:
        chunked = (x[:, _B, None] == self.timed).any(1) if self.timed else np.zeros(len(x), dtype=bool)
        if chunked.all():
            return self._summed(x, adjust)
        out = np.empty((self.size, len(x)))
        out[:, ~chunked] = self.untimed.members(x[~chunked])
        if chunked.any():
            out[:, chunked] = self._summed(x[chunked], adjust)
        return out

    def _summed(self, x: np.ndarray, adjust: Adjust | None) -> np.ndarray:
        """[K, rows] log ms of each uniform plan as the sum of its chunks' predicted costs."""
        owner, q, h, weight = priced_chunks(x)
        n = x[:, _N]
        # the priced chunks, then each plan's first decode step (one token after n): one call per
        # member, on each distinct chunk once (a chunk's cost depends on its config, q and h only, so
        # the plans of one config share most of theirs: a decision table's lengths, a fold's sizes)
        rows, cq, ch = (
            np.concatenate([owner, np.arange(len(x))]),
            np.concatenate([q, np.ones_like(n)]),
            np.concatenate([h, n]),
        )
        config = _config_ids(x[:, _CONFIG])  # [rows of x] its config's id
        key = (config[rows] << 42) | (cq.astype(np.int64) << 21) | ch.astype(np.int64)  # q, h < 2**21 (MAX_CONTEXT)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        log_ms = self.chunk_log_ms(x[rows[first]], cq[first], ch[first])[:, inverse]
        chunks, decode = log_ms[:, : len(q)], log_ms[:, len(q) :]  # [K, priced chunks], [K, rows]
        if adjust is not None:
            chunks = chunks + adjust(x[owner], q, h)
        # each plan's priced chunks lie together, in the order of `x`, and a plan has one at least:
        # summed plan by plan, in order (a row's sum never depends on its batch)
        starts = np.concatenate(([0], np.flatnonzero(owner[1:] != owner[:-1]) + 1))
        prefill = np.add.reduceat(weight * np.exp(chunks), starts, axis=1)
        return np.log(prefill + np.exp(decode) + self.tokenize_ms_per_token * n)

    def compile(self, cache: Path | None = None) -> None:
        self.forest.compile(cache)
        if self.untimed is not None:
            self.untimed.compile(cache)

    def save(self, folder: Path) -> dict:
        self.forest.save(folder, self.kind)
        return {
            "kind": self.kind,
            "params": self.params,
            "size": self.size,
            "tokenize_ms_per_token": self.tokenize_ms_per_token,
            "timed": self.timed,
            "untimed": self.untimed.save(folder),
        }

    @classmethod
    def load(cls, folder: Path, saved: dict) -> PerChunk:
        model = cls(saved["params"], saved["size"], tokenize_ms_per_token=saved["tokenize_ms_per_token"])
        model.forest = Forest.load(folder, model.kind, model.size)
        model.timed, model.untimed = saved["timed"], PerCandidate.load(folder, saved["untimed"])
        return model


@dataclass
class PerCandidate:
    params: dict = field(default_factory=dict)
    size: int = MEMBERS
    kind: str = "per-candidate"
    forest: Forest = field(default_factory=Forest, repr=False)

    def fit(self, data: Measured) -> None:
        target = np.log(data.ttft_ms) - base_log_ms(data.x)
        boosters = []
        for seed in range(self.size):
            params, rounds = lgb_params({**self.params, "monotone_constraints": list(MONOTONE)}, seed)
            dataset = lgb.Dataset(data.x, target, feature_name=list(FEATURES))
            boosters.append(lgb.train(params, dataset, num_boost_round=rounds))
        self.forest = Forest(boosters)

    def members(self, x: np.ndarray, adjust: Adjust | None = None) -> np.ndarray:
        if adjust is not None:
            raise ValueError("the per-candidate model predicts whole plans: a per-chunk correction cannot apply")
        return self.forest.predict(x) + base_log_ms(x)

    def compile(self, cache: Path | None = None) -> None:
        self.forest.compile(cache)

    def save(self, folder: Path) -> dict:
        self.forest.save(folder, self.kind)
        return {"kind": self.kind, "params": self.params, "size": self.size}

    @classmethod
    def load(cls, folder: Path, saved: dict) -> PerCandidate:
        model = cls(saved["params"], saved["size"])
        model.forest = Forest.load(folder, model.kind, model.size)
        return model


# what the analytic fit keeps apart: the model's shape, the machine, dtype, threads and kernel
_MACHINE_AND_MODEL = [FEATURES.index(name) for name in (*SHAPE_COLUMNS, *RUNTIME)]
_W = FEATURES.index("window")


@dataclass
class Analytic:
    """vllm-ascend's profiled fit, summed over chunks: TTFT = a*sum C(C+H) + b*N + c*sum H + d, with
    H the history each chunk attends (capped by the window), least squares per model shape and
    machine (its descriptors, dtype, threads, kernel); the pooled fit where a pair is unseen. One
    member: no spread, so its recipe is a plain argmin."""

    params: dict = field(default_factory=dict)  # none: kept for the recipe's params
    size: int = 1
    kind: str = "analytic"
    coef: dict[str, list[float]] = field(default_factory=dict, repr=False)  # key -> coefficients; "" pooled

    @staticmethod
    def _terms(x: np.ndarray) -> np.ndarray:
        n, c = x[:, _N], x[:, _C]
        w = np.where(x[:, _W] > 0, x[:, _W], np.inf)
        return np.column_stack([keys_sum(n, c, w), n, history_sum(n, c, w), np.ones_like(n)])

    @staticmethod
    def _keys(x: np.ndarray) -> list[str]:
        return [",".join(f"{v:g}" for v in row) for row in np.round(x[:, _MACHINE_AND_MODEL], 4).tolist()]

    def fit(self, data: Measured) -> None:
        terms, keys = self._terms(data.x), np.array(self._keys(data.x))
        self.coef = {"": np.linalg.lstsq(terms, data.ttft_ms, rcond=None)[0].tolist()}
        for key in np.unique(keys).tolist():
            mine = keys == key
            if mine.sum() >= 4:
                self.coef[key] = np.linalg.lstsq(terms[mine], data.ttft_ms[mine], rcond=None)[0].tolist()

    def members(self, x: np.ndarray, adjust: Adjust | None = None) -> np.ndarray:
        if adjust is not None:
            raise ValueError("the analytic fit predicts whole plans: a per-chunk correction cannot apply")
        coef = np.array([self.coef.get(key, self.coef[""]) for key in self._keys(x)])  # [rows, 4]
        return np.log(np.maximum((self._terms(x) * coef).sum(1), 1e-3))[None]

    def compile(self, cache: Path | None = None) -> None:
        pass  # a closed form: nothing to compile

    def save(self, folder: Path) -> dict:
        (folder / f"{self.kind}.json").write_text(json.dumps(self.coef))
        return {"kind": self.kind, "params": self.params, "size": self.size}

    @classmethod
    def load(cls, folder: Path, saved: dict) -> Analytic:
        return cls(saved["params"], coef=json.loads((folder / f"{cls.kind}.json").read_text()))


KINDS: dict[str, type[PerChunk] | type[PerCandidate] | type[Analytic]] = {
    "per-chunk": PerChunk,
    "per-candidate": PerCandidate,
    "analytic": Analytic,
}


def load_cost_model(folder: Path, saved: dict) -> PerChunk | PerCandidate | Analytic:
    kind = saved.get("kind")
    if kind not in KINDS:
        raise ValueError(f"cost model kind {kind!r} is not one of {', '.join(KINDS)}")
    return KINDS[kind].load(folder, saved)
