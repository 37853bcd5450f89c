"""Bounded exploration: a learner that only sees its own argmin never learns it was wrong. The
service may answer the best other candidate instead, when the model cannot tell the two apart (the
predicted gap is within the model's own held-out error) and the extra TTFT exploring has cost so
far, by the model's own predictions, stays within `budget` of the TTFT it has served."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

from .model import Answer


@dataclass
class Explorer:
    budget: float  # share of the served (predicted) TTFT that exploring may cost; 0: never
    served_ms: float = 0.0
    spent_ms: float = 0.0
    explored: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def spent_share(self) -> float:
        return self.spent_ms / self.served_ms if self.served_ms else 0.0

    def answer(self, best: Answer, uncertainty: float) -> Answer:
        """`best`, or the best other candidate marked explored; `uncertainty` is the model's relative
        error on held-out configs (its MAPE)."""
        others = [c for c in best.top if c.chunk_size != best.chunk_size]
        with self._lock:
            self.served_ms += best.predicted_ttft_ms
            if not others or self.budget <= 0:
                return best
            other = others[0]  # top is sorted by predicted TTFT
            extra = max(other.predicted_ttft_ms - best.predicted_ttft_ms, 0.0)
            if extra > uncertainty * best.predicted_ttft_ms or self.spent_ms + extra > self.budget * self.served_ms:
                return best
            self.spent_ms += extra
            self.explored += 1
        return dataclasses.replace(best, chunk_size=other.chunk_size, predicted_ttft_ms=other.predicted_ttft_ms,
                                   explored=True)  # fmt: skip
