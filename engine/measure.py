"""The one measuring harness (engine, profiler, evaluator, benches): warm-up passes, then passes in
which every candidate runs once, the order rotated each pass so that drift and cache state hit
every candidate alike; the spread of what was measured, and the ratio of two candidates with its
interval."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def interleaved(steps: Mapping[K, Callable[[], T]], repeats: int, warmup: int = 1, start: int = 0) -> dict[K, list[T]]:
    """Each step's results over `repeats` kept passes, after `warmup` discarded ones; pass p runs
    the steps from position (start + p) mod len onwards, wrapping around."""
    keys = list(steps)
    kept: dict[K, list[T]] = {key: [] for key in keys}
    for p in range(warmup + repeats):
        r = (start + p) % len(keys)
        for key in keys[r:] + keys[:r]:
            result = steps[key]()
            if p >= warmup:
                kept[key].append(result)
    return kept


def spread(values: list[float]) -> tuple[float, float]:
    """(IQR, coefficient of variation) of repeated timings."""
    if len(values) < 2:
        return 0.0, 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1, statistics.pstdev(values) / statistics.fmean(values)


def resampled_rounds(rounds: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[B, R] round indices drawn with replacement: the one bootstrap of the project. Every quantity
    compared over the same rounds (candidates, policies) is read at the same draws, so the interval
    is paired and drift between rounds cancels."""
    return rng.integers(0, rounds, (resamples, rounds))


def median_ratio(a: list[float], b: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """median(a) / median(b) over paired passes, and its bootstrap 95% interval."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    draws = resampled_rounds(len(a_), 2000, rng)
    boot = np.median(a_[draws], axis=1) / np.median(b_[draws], axis=1)
    low, high = np.quantile(boot, [0.025, 0.975])
    return float(np.median(a_) / np.median(b_)), float(low), float(high)
