"""In what order to measure configs, and how long each will take.

The order is space-filling (greedy maximin), so that any prefix of it, such as what a time budget
allows, already covers every model/dtype/thread/kernel level and spreads over context length and
window. Time per config is a FLOP-like proxy scaled by what the run has measured so far.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from chunkpilot.chunks import chunk_count
from chunkpilot.contract import PRESETS, ConfigError, ModelShape
from chunkpilot.features import keys_sum, linear_flops

from .spec import ProfileConfig

FALLBACK_SHAPE = PRESETS["mistral-44m"]  # checkpoint folders: a mid-sized guess until measured
# (seconds per FLOP, seconds per forward call) until the run has measured something: a 2-core CPU
# at ~50 GFLOP/s effective, a data-centre GPU at ~200 TFLOP/s; ~5 ms of fixed cost per call on either
INITIAL_SECONDS = {"cpu": (1 / 50e9, 5e-3), "cuda": (1 / 200e12, 5e-3)}


def known_shape(model: str) -> ModelShape:
    if model in PRESETS:
        return PRESETS[model]
    path = Path(model)
    if path.is_file():
        return ModelShape.from_file(path)
    if path.is_dir():
        return FALLBACK_SHAPE
    raise ConfigError(
        "models", f"{model!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint folder nor a shape file"
    )


def config_cost(config: ProfileConfig, shape: ModelShape, chunks: list[int], passes: int) -> tuple[float, float]:
    """(FLOPs, forward calls) to run every candidate `passes` times: the feature builder's analytic
    terms (projections, attention with keys limited by the window) and one call per chunk."""
    n, window, layers = config.context_length, config.window or math.inf, shape.num_layers
    linear = linear_flops(
        n, layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.intermediate_size
    )
    attention = [4 * layers * shape.num_heads * shape.head_dim * float(keys_sum(n, c, window)) for c in chunks]
    calls = sum(chunk_count(n, c) for c in chunks)
    return (linear * len(chunks) + sum(attention)) * passes, calls * passes


def space_filling_order(configs: list[ProfileConfig]) -> list[ProfileConfig]:
    """Greedy maximin over (log context, log window, sinks) in [0, 1] plus a distance of 1 per
    differing level of model, dtype, threads, kernel and layout (so levels are covered first)."""
    if not configs:
        return []
    numeric = np.array(
        [[math.log2(c.context_length), math.log2(c.window) if c.window else 0.0, float(c.sinks > 0)] for c in configs]
    )
    span = numeric.max(0) - numeric.min(0)
    numeric = (numeric - numeric.min(0)) / np.where(span > 0, span, 1)
    levels = [(c.model, c.dtype, c.threads, c.attn_impl, c.layout) for c in configs]
    codes = np.array([[hash(v) for v in level] for level in levels])

    def distance_to(i: int) -> np.ndarray:
        return np.linalg.norm(numeric - numeric[i], axis=1) + (codes != codes[i]).sum(1)

    order = [0]
    nearest = distance_to(0)
    for _ in range(len(configs) - 1):
        nearest[order[-1]] = -1.0
        nxt = int(nearest.argmax())
        order.append(nxt)
        nearest = np.minimum(nearest, distance_to(nxt))
    return [configs[i] for i in order]


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of y on x's two columns with coefficients >= 0 (numpy only: the GPU machine's
    profiler runs without scipy). The optimum is the unconstrained fit if it is feasible, else the
    best fit on one column with the other at 0."""
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    if (coef >= 0).all():
        return coef
    candidates = [np.zeros(2)]
    for j in range(2):
        single = np.zeros(2)
        single[j] = max(float(x[:, j] @ y) / max(float(x[:, j] @ x[:, j]), 1e-300), 0.0)
        candidates.append(single)
    return min(candidates, key=lambda c: float(np.sum((x @ c - y) ** 2)))


class TimeModel:
    """seconds = a * FLOPs + b * calls, fitted (non-negative) on the configs finished so far, times
    a per-(dtype, threads) factor once that group has been measured."""

    def __init__(self, device: str = "cpu") -> None:
        self.points: list[tuple[tuple[str, int], float, float, float]] = []  # group, flops, calls, seconds
        self.coef = np.array(INITIAL_SECONDS[device])
        self.factor: dict[tuple[str, int], float] = {}

    def learn(self, config: ProfileConfig, cost: tuple[float, float], seconds: float) -> None:
        group = (config.dtype, config.threads)
        self.points.append((group, *cost, seconds))
        if len(self.points) >= 3:
            x = np.array([[f, c] for _, f, c, _ in self.points])
            y = np.array([s for *_, s in self.points])
            scale = x.max(0)  # better conditioned on columns of similar size
            coef = _nonnegative_fit(x / scale, y)
            if coef.any():
                self.coef = coef / scale
        ratios = [s / max(self._base(f, c), 1e-9) for g, f, c, s in self.points if g == group]
        self.factor[group] = statistics.median(ratios)

    def _base(self, flops: float, calls: float) -> float:
        return float(self.coef @ np.array([flops, calls]))

    def seconds(self, config: ProfileConfig, cost: tuple[float, float]) -> float:
        return self._base(*cost) * self.factor.get((config.dtype, config.threads), 1.0)
