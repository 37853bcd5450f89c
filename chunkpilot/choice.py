"""The decision from a config's predictions, one function for training's cross-validation and the
service: the regressor's levels (log TTFT per candidate), optionally combined with the ranker's
order (the lowest sum of the two ranks, the level breaking ties), then "do no harm": the hand
rule's size unless the pick is predicted to save more than `rule_margin` over it."""

from __future__ import annotations

import math
from collections.abc import Sequence


def _ranks(values: Sequence[float]) -> list[int]:
    ranks = [0] * len(values)
    for rank, i in enumerate(sorted(range(len(values)), key=values.__getitem__)):
        ranks[i] = rank
    return ranks


def pick(
    log_ms: Sequence[float], rank_score: Sequence[float] | None, rule: int | None, rule_margin: float
) -> tuple[int, bool]:
    """(index of the chosen candidate, whether the margin sent it to the rule's size); `rule` is
    the rule's index among the candidates (None: not among them)."""
    if rank_score is None:
        best = min(range(len(log_ms)), key=log_ms.__getitem__)
    else:
        combined = [a + b for a, b in zip(_ranks(log_ms), _ranks([-s for s in rank_score]), strict=True)]
        best = min(range(len(log_ms)), key=lambda i: (combined[i], log_ms[i]))
    if rule_margin > 0 and rule is not None and best != rule and log_ms[rule] - log_ms[best] < math.log1p(rule_margin):
        return rule, True
    return best, False
