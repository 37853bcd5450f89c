"""Bounded exploration: a learner that only sees its own choice never learns it was wrong. The
service may answer another candidate instead: the waiting challenger's choice where it differs (so
that the gate can compare the two models on measured prefills, promotion.settle), else the candidate
whose measurement is expected to gain the most (estimator.decide.Gain: the expected improvement over the
choice under the members' spread of the gap, at least estimator.decide.GAP_SD_FLOOR, so a candidate
predicted slightly slower but very uncertain is worth more than a runner-up the ensemble agrees on).
Either only while the extra TTFT exploring has
cost so far, by the model's own predictions, stays within `budget` of the TTFT it has served: the
bound is spent <= budget x served (predicted; the measured extra is reported by the closed-loop bench),
and never twice running for the same kind of request, so that the choice itself is measured too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from chunkpilot.contract import Decision
from estimator.decide import gains_of

MIN_GAIN = 0.0005  # expected gain, as a share of the choice's TTFT, below which a candidate is not worth measuring


@dataclass
class Explorer:
    budget: float  # share of the served (predicted) TTFT that exploring may cost; 0: never
    served_ms: float = 0.0
    spent_ms: float = 0.0
    explored: int = 0
    memory: int = 4096  # requests remembered as explored last time
    _last: OrderedDict[str, None] = field(default_factory=OrderedDict, repr=False)  # explored last time
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def spent_share(self) -> float:
        return self.spent_ms / self.served_ms if self.served_ms else 0.0

    def explore(self, best: Decision, shadow: int | None = None, key: str = "") -> Decision:
        """`best`, or another of its candidates marked explored; `shadow` is the waiting challenger's
        choice, `key` its neighbourhood (correction.neighbourhood)."""

        gains = gains_of(best)
        with self._lock:
            self.served_ms += best.predicted_ttft_ms
            if key in self._last:  # explored last time: this time the choice itself is measured
                del self._last[key]
                return best
            if self.budget <= 0 or not gains:
                return best
            other = next((g for g in gains if g.chunk_size == shadow), None) or max(gains, key=lambda g: g.gain)
            if other.chunk_size != shadow and other.gain < MIN_GAIN:
                return best  # the ensemble agrees the choice is best: nothing to learn worth a prefill
            extra = max(other.ratio - 1.0, 0.0) * best.predicted_ttft_ms
            if self.spent_ms + extra > self.budget * self.served_ms:
                return best
            self.spent_ms += extra
            self.explored += 1
            self._last[key] = None
            if len(self._last) > self.memory:
                self._last.popitem(last=False)
        return best.model_copy(
            update={
                "chunk_size": other.chunk_size,
                "predicted_ttft_ms": other.ratio * best.predicted_ttft_ms,
                "explored": True,
                "span": None,  # for this prefill only
            }
        )
