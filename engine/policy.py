"""Chunk-size policies: asked once before each prefill (`decide`), told how it went (`observe`),
closed when done (`close`). The `auto` policy (the predictor's client, auto/client.py)
is one more `ChunkPolicy`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chunkpilot.chunks import rule_size, simple_rule
from chunkpilot.contract import ChunkRequest, ConfigError, Decision, number
from judge.lineup import Baseline, applied

if TYPE_CHECKING:
    from .engine import TTFTResult

DECISION_TIMEOUT_S = 0.05  # `auto` waits this long for the service before a prefill, then its anchor answers


class ChunkPolicy:
    """What the engine asks before a prefill. Only `decide` must be written: a rule hears nothing
    back and holds nothing to close."""

    name: str

    def decide(self, request: ChunkRequest) -> Decision:
        raise NotImplementedError

    def observe(self, request: ChunkRequest, result: TTFTResult) -> None:
        """How the prefill it decided went, told after the clock stopped (`auto` reports and learns)."""

    def close(self) -> None:
        """The caller is done with it (`auto` flushes its telemetry and its connections)."""


@dataclass(frozen=True)
class FixedPolicy(ChunkPolicy):
    size: int
    capped: bool = False  # cut to what the config allows (ring: the window) instead of refusing
    name: str = "fixed"

    def decide(self, request: ChunkRequest) -> Decision:
        if self.capped:
            return Decision(chunk_size=request.clamp(self.size), source="fixed")
        request.attention.check_chunk(self.size)
        return Decision(chunk_size=self.size, source="fixed")


@dataclass(frozen=True)
class FullPolicy(ChunkPolicy):
    """One shot: the whole prompt in one chunk."""

    name: str = "full"

    def decide(self, request: ChunkRequest) -> Decision:
        request.attention.check_chunk(request.context_length)
        return Decision(chunk_size=request.context_length, source="full")


@dataclass(frozen=True)
class RulePolicy(ChunkPolicy):
    """A rule of thumb, cut to what the config allows, so that it always has an answer: the hand
    rule, or `RulePolicy("simple-rule", simple_rule)` (one shot without a window, else the hand rule)."""

    name: str = "rule"
    size: Callable[[int, int | None, str], int] = rule_size  # (context, window, layout) -> chunk

    def decide(self, request: ChunkRequest) -> Decision:
        att = request.attention
        return Decision(chunk_size=self.size(request.context_length, att.window, att.layout), source="rule")


SOURCES = {"full": "full", "rule": "rule", "simple-rule": "rule"}  # a baseline's decision source; a size: fixed


@dataclass(frozen=True)
class BaselinePolicy(ChunkPolicy):
    """A baseline of the lineup (judge.lineup) as the engine runs it: its spec applied, cut to
    what the config allows; `strict`: one shot refuses a prompt it cannot take in one chunk (a race
    then leaves it out there) instead of running the largest chunk allowed."""

    baseline: Baseline
    strict: bool = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.baseline.name

    def decide(self, request: ChunkRequest) -> Decision:
        spec, att, n = self.baseline.spec, request.attention, request.context_length
        if self.strict and spec == "full":
            att.check_chunk(n)
        return Decision(chunk_size=applied(spec, n, att.window, att.layout), source=SOURCES.get(spec, "fixed"))


@dataclass(frozen=True)
class SchedulePolicy(ChunkPolicy):
    """Chunk sizes in order (Sarathi-Serve's decreasing chunks, say): the last repeats until the prompt
    is covered and the final chunk is cut to what is left, so one pattern serves any prompt."""

    sizes: tuple[int, ...]
    name: str = "schedule"

    def decide(self, request: ChunkRequest) -> Decision:
        chunks: list[int] = []
        left = request.context_length
        while left > 0:
            chunks.append(min(self.sizes[min(len(chunks), len(self.sizes) - 1)], left))
            left -= chunks[-1]
        request.attention.check_schedule(chunks, request.context_length)
        return Decision(chunk_size=chunks[0], source="schedule", schedule=tuple(chunks))


def parse_policy(value: str | int) -> ChunkPolicy:
    """`--chunk-size`: a positive integer, `full`, `rule`, `simple-rule` or a schedule `1024,512,256`."""
    if value == "full":
        return FullPolicy()
    if value == "rule":
        return RulePolicy()
    if value == "simple-rule":
        return RulePolicy("simple-rule", simple_rule)
    try:
        if isinstance(value, str) and "," in value:
            return SchedulePolicy(tuple(number("chunk_size", v.strip(), int, ge=1) for v in value.split(",")))
        return FixedPolicy(number("chunk_size", value, int, ge=1))
    except ConfigError:
        raise ConfigError(
            "chunk_size",
            f"must be a positive integer, 'full', 'rule', 'simple-rule' or sizes like 1024,512; got {value!r}",
        ) from None
