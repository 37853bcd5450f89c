"""Bounded exploration: a learner that only sees its own argmin never learns it was wrong. The
service may answer another candidate instead: the waiting challenger's pick where it differs (so
that the gate can compare the two models on measured prefills, registry.settle), else the best other
candidate when the model cannot tell the two apart (the predicted gap is within the model's own
held-out error); either only while the extra TTFT exploring has cost so far, by the model's own
predictions, stays within `budget` of the TTFT it has served, and never twice running for the same
request, so that the pick itself is measured too (where the model can't tell, the predicted cost of
exploring is near zero and the budget alone would let every answer explore)."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from .model import Answer


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

    def answer(self, best: Answer, uncertainty: float, shadow: int | None = None, key: str = "") -> Answer:
        """`best`, or another candidate of its top marked explored; `uncertainty` is the model's relative
        error on held-out configs (its MAPE), `shadow` the waiting challenger's pick, `key` the request."""
        others = [c for c in best.top if c.chunk_size != best.chunk_size]  # sorted by predicted TTFT
        other = next((c for c in others if c.chunk_size == shadow), None)
        unsure_only = other is None  # no challenger disagrees: explore only where the model can't tell
        other = other or (others[0] if others else None)
        with self._lock:
            self.served_ms += best.predicted_ttft_ms
            if key in self._last:  # explored last time: this time the pick itself is measured
                del self._last[key]
                return best
            if self.budget <= 0 or other is None:
                return best
            extra = max(other.predicted_ttft_ms - best.predicted_ttft_ms, 0.0)
            if unsure_only and extra > uncertainty * best.predicted_ttft_ms:
                return best
            if self.spent_ms + extra > self.budget * self.served_ms:
                return best
            self.spent_ms += extra
            self.explored += 1
            self._last[key] = None
            if len(self._last) > self.memory:
                self._last.popitem(last=False)
        return dataclasses.replace(best, chunk_size=other.chunk_size, predicted_ttft_ms=other.predicted_ttft_ms,
                                   explored=True)  # fmt: skip
