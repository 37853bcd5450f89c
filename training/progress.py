"""A training run's progress on stderr: its stages, the policy being cross-validated, and each
stage's ETA from its own folds so far (a training run takes minutes; a silent terminal looks hung)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from chunkpilot.clock import clock

EVERY_S = 10.0  # at most one line per this many seconds within a stage, and its last fold


@dataclass
class Progress:
    stream: TextIO | None = field(default_factory=lambda: sys.stderr)  # None: silent
    start: float = field(default_factory=time.monotonic)

    def say(self, line: str) -> None:
        if self.stream is not None:
            print(f"[train {clock(time.monotonic() - self.start)}] {line}", file=self.stream, flush=True)

    def stage(self, what: str, folds: int) -> Stage:
        self.say(f"{what}: {folds} folds")
        return Stage(self, what, folds)


@dataclass
class Stage:
    progress: Progress
    what: str
    folds: int
    done: int = 0
    start: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)

    def fold_done(self, slice_name: str) -> None:
        self.done += 1
        now = time.monotonic()
        if self.done < self.folds and now - self.last < EVERY_S:
            return
        self.last = now
        eta = (now - self.start) / self.done * (self.folds - self.done)
        left = f", ETA {clock(eta)}" if self.done < self.folds else f", {clock(now - self.start)}"
        self.progress.say(f"{self.what}: fold {self.done}/{self.folds} ({slice_name}){left}")
