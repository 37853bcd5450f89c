"""Paired bootstrap intervals, the one bootstrap of the project: every quantity compared over the
same rounds (candidates, policies, builds) is read at the same resampled rounds, so the interval is
paired and drift between rounds cancels. Pure numpy: the engine measures, the judges (evaluation/,
the benches) score with this."""

from __future__ import annotations

import numpy as np


def resampled_rounds(rounds: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[B, R] round indices drawn with replacement."""
    return rng.integers(0, rounds, (resamples, rounds))


def median_ratio(a: list[float], b: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """median(a) / median(b) over paired passes, and its bootstrap 95% interval."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    draws = resampled_rounds(len(a_), 2000, rng)
    boot = np.median(a_[draws], axis=1) / np.median(b_[draws], axis=1)
    low, high = np.quantile(boot, [0.025, 0.975])
    return float(np.median(a_) / np.median(b_)), float(low), float(high)
