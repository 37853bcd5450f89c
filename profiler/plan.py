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

from chunkpilot.config import PRESETS, ConfigError, ModelShape

from .spec import ProfileConfig

FALLBACK_SHAPE = PRESETS["mistral-44m"]  # checkpoint folders: a mid-sized guess until measured
CALL_OVERHEAD_UNITS = 2e8  # one forward call's fixed cost, in FLOP units (Python, dispatch)
INITIAL_SECONDS_PER_UNIT = 1 / 50e9  # ~50 GFLOP/s effective until the run has measured something


def known_shape(model: str) -> ModelShape:
    if model in PRESETS:
        return PRESETS[model]
    path = Path(model)
    if path.is_file():
        return ModelShape.from_file(path)
    if path.is_dir():
        return FALLBACK_SHAPE
    raise ConfigError("models", f"{model!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint folder nor a shape file")


def cost_units(config: ProfileConfig, shape: ModelShape, chunks: list[int], passes: int) -> float:
    """FLOP-like units to run every candidate `passes` times: projections, attention, per-call overhead."""
    d, heads, kv, hd = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim
    per_token = 2 * shape.num_layers * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * shape.intermediate_size)
    n, window = config.context_length, config.window
    total = 0.0
    for c in chunks:
        for start in range(0, n, c):
            q = min(c, n - start)
            keys = start + q if window is None else min(start + q, window + q)
            total += per_token * q + 4 * shape.num_layers * heads * hd * q * keys + CALL_OVERHEAD_UNITS
    return total * passes


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


class TimeModel:
    """Seconds per cost unit, learned per (dtype, threads) from finished configs."""

    def __init__(self) -> None:
        self.ratios: dict[tuple[str, int], list[float]] = {}

    def learn(self, config: ProfileConfig, units: float, seconds: float) -> None:
        self.ratios.setdefault((config.dtype, config.threads), []).append(seconds / units)

    def seconds(self, config: ProfileConfig, units: float) -> float:
        own = self.ratios.get((config.dtype, config.threads))
        every = [r for rs in self.ratios.values() for r in rs]
        rate = statistics.median(own) if own else statistics.median(every) if every else INITIAL_SECONDS_PER_UNIT
        return rate * units
