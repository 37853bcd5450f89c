"""The one measuring harness (engine, profiler, evaluator, benches): warm-up passes, then passes in
which every candidate runs once, the order rotated each pass so that drift and cache state hit
every candidate alike; and the spread of what was measured. Its intervals (the bootstrap) are
scoring: judge/intervals.py."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

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
