"""Regret on a fixed probe set measured once: every size of every probe timed over the same rounds
(evaluation.rounds.time_sizes; each policy's choices and their decision times by
evaluation.rounds.timed), so that any number of policies, or of rounds of a learning one, are
scored on the very same times. A policy's regret on a probe is the median TTFT of the size it picks
over the best size's; the interval a bootstrap over the rounds, the same resampled rounds for every
size of every probe, so paired between policies. Net: each policy charged its own decision's time."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from .intervals import resampled_rounds

Times = dict[int, dict[int, list[float]]]  # probe index -> chunk size -> TTFT ms over the rounds
Choices = tuple[dict[int, int], dict[int, float]]  # (probe index -> chunk size, -> ms its decision took)
Interval = tuple[float, float, float]  # (the point estimate, the 95% interval's low and high)


def regret_of(measured: Mapping[int, float], chunk: int) -> float:
    """The regret of choosing `chunk` where `measured` (size -> TTFT ms) was timed: its TTFT over the
    fastest measured size's, less one. Every judge of a choice on measured sizes scores it so."""
    return measured[chunk] / min(measured.values()) - 1


PerProbe = Callable[[int, dict[int, float]], float]  # (probe index, size -> median ms) -> a number


def bootstrapped(times: Times, per_probe: PerProbe, resamples: int, seed: int = 0) -> Interval:
    """(mean over the probes of `per_probe(i, medians)`, its 95% interval): a bootstrap over rounds."""
    rounds = min(len(v) for t in times.values() for v in t.values())
    draws = resampled_rounds(rounds, resamples, np.random.default_rng(seed))

    def mean(index: np.ndarray) -> float:
        return float(
            np.mean(
                [
                    per_probe(i, {c: float(np.median(np.asarray(v)[index])) for c, v in sizes.items()})
                    for i, sizes in times.items()
                ]
            )
        )

    boot = [mean(d) for d in draws]
    return mean(np.arange(rounds)), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def regret(times: Times, choices: Choices, net: bool = False, seed: int = 0) -> Interval:
    """Mean regret over the probes: median TTFT of the choice (plus its decision's time, if `net`)
    over the best size's."""
    size, ms = choices
    return bootstrapped(times, lambda i, med: regret_of(med, size[i]) + net * ms[i] / min(med.values()), 1000, seed)


def regret_gap(times: Times, ours: Choices, theirs: Choices, net: bool = False, seed: int = 0) -> Interval:
    """Mean regret of `ours` minus that of `theirs` over the probes, paired; `net`: each charged its
    own decision's time."""
    (a, a_ms), (b, b_ms) = ours, theirs

    def gap(i: int, med: dict[int, float]) -> float:
        return (med[a[i]] - med[b[i]] + net * (a_ms[i] - b_ms[i])) / min(med.values())

    return bootstrapped(times, gap, 2000, seed)
