"""Race prompts nobody tuned for: drawn afresh at every run from a seeded generator whose support is
disjoint from what the model was profiled or taught on. A prompt's length is never one of the
lengths the model's profiled configs or learning workload hold, and its window never one of their
windows, so a policy cannot have been fitted to it; the seed is printed and recorded, so a run
can be repeated. tests/test_comparison.py checks the disjointness for many seeds."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from chunkpilot.contract import AttentionConfig
from engine.workload import Workload


@dataclass(frozen=True)
class Seen:
    """The lengths and windows a model was profiled or taught on: what a race prompt avoids."""

    lengths: frozenset[int]
    windows: frozenset[int]

    @classmethod
    def of(cls, configs: Iterable[tuple[int, int | None]]) -> Seen:
        """From (context length, window or None) pairs: spec configs, workloads, dataset rows."""
        pairs = list(configs)
        return cls(frozenset(n for n, _ in pairs), frozenset(w for _, w in pairs if w))

    def __or__(self, other: Seen) -> Seen:
        return Seen(self.lengths | other.lengths, self.windows | other.windows)


@dataclass(frozen=True)
class Kind:
    """A kind of race prompt: its lengths' range, and its window's range and layout (none: no window)."""

    lengths: tuple[int, int]
    windows: tuple[int, int] | None = None
    layout: str = "shift"
    sinks: int = 0


# the demo's six: without a window, a shift window (a Hugging Face cache) and a ring (ExecuTorch's),
# short and long, sinks on one of each windowed layout. Kinds of one set-up never share lengths
# (`overlapping`): else a race's prompts could be two of a kind
DEMO_KINDS = (
    Kind((800, 3000)),
    Kind((3000, 9000)),
    Kind((1500, 6000), (512, 3072), "shift"),
    Kind((5000, 12000), (1024, 3072), "shift", 4),
    Kind((3000, 9000), (256, 1024), "ring"),
    Kind((1500, 5000), (192, 768), "ring", 4),
)
# bench/policies.py's kinds for a backend that runs its model's own attention (transformers,
# llama.cpp): short, medium and long; no flash attention: one shot holds heads x n^2 scores
OWN_ATTENTION_LENGTHS = ((700, 2000), (2000, 3500), (3500, 6000))
WINDOW_STEP = 64  # windows are multiples of this, as models' are


def race_kinds(backend: str) -> tuple[Kind, ...]:
    """bench/policies.py's prompt kinds: the bundled engine runs any attention set-up; the other
    backends their model's own (engine.backends.own_attention), so only the lengths differ."""
    if backend != "chunkpilot":
        return tuple(Kind(lengths) for lengths in OWN_ATTENTION_LENGTHS)
    return (Kind((700, 3000)), Kind((1500, 6000), (512, 2048), "shift"), Kind((3000, 9000), (256, 1024), "ring", 4))


def overlapping(kinds: Iterable[Kind]) -> list[tuple[Kind, Kind]]:
    """The pairs of kinds of one attention set-up (windows, layout, sinks) whose lengths' ranges
    overlap (ranges that only touch do not)."""
    kinds = list(kinds)
    return [
        (a, b)
        for i, a in enumerate(kinds)
        for b in kinds[i + 1 :]
        if (a.windows, a.layout, a.sinks) == (b.windows, b.layout, b.sinks)
        and max(a.lengths[0], b.lengths[0]) < min(a.lengths[1], b.lengths[1])
    ]


def _draw_length(rng: random.Random, low: int, high: int, seen: frozenset[int]) -> int:
    while True:  # log-uniform: as many short prompts as long ones
        n = round(math.exp(rng.uniform(math.log(low), math.log(high))))
        if n not in seen:
            return n


def _draw_window(rng: random.Random, low: int, high: int, seen: frozenset[int]) -> int:
    choices = [w for w in range(low, high + 1, WINDOW_STEP) if w not in seen]
    if not choices:
        raise ValueError(f"every window in [{low}, {high}] was seen: widen the kind's range")
    return rng.choice(choices)


def draw_prompts(seed: int, seen: Seen, kinds: Iterable[Kind] = DEMO_KINDS) -> list[Workload]:
    """One prompt of each kind, drawn from `seed`: a length and a window `seen` does not hold, the
    window below the length; each prompt's words drawn from the seed too."""
    rng = random.Random(seed)
    prompts = []
    for i, kind in enumerate(kinds):
        attention = AttentionConfig()
        if kind.windows is not None:  # the window moves inside the prompt: at most half its length
            window = _draw_window(rng, kind.windows[0], min(kind.windows[1], kind.lengths[1] // 2), seen.windows)
            attention = AttentionConfig(window, kind.layout, kind.sinks)
            n = _draw_length(rng, max(kind.lengths[0], 2 * window), kind.lengths[1], seen.lengths)
        else:
            n = _draw_length(rng, *kind.lengths, seen.lengths)
        prompts.append(Workload(n, attention, seed=seed * 100 + i))
    return prompts
