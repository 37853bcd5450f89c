"""The decision table: the recipe's answers per kind of request (everything but the context length)
as segments of lengths, so that most decisions cost a dict lookup and a bisection.

The recipe decides each cell of lengths (chunkpilot.chunks.length_cell) at its first and last
length; where the two disagree the choice flips inside, and the cell is halved until every
segment's ends agree (chunkpilot.chunks.segments), so that a flip is found where the recipe makes
it. A segment answers its ends' decision for every length in it, its predicted TTFTs the nearer
end's scaled by n / end (the lengths of a cell are within 1.1% of each other, a tenth of the
held-out TTFT error). Training's cross-validation scores exactly this path (training/served.py):
what is judged is what is served. A kind's segments are built by one background thread when the
kind is first seen, and rebuilt when the correction has learnt, the old answers serving meanwhile.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from chunkpilot.chunks import (
    CELLS,
    DEFAULT_CHUNKS,
    EXACT_BELOW,
    MAX_CONTEXT,
    RULE_EDGES,
    Segment,
    length_cell,
    segments,
)
from chunkpilot.contract import Candidate, ChunkRequest, ChunkResponse

from .answer import Answer

MAX_KINDS = 64  # kinds kept (least recently asked go first): a client inventing kinds costs memory only so far
REBUILD_S = 30.0  # a kind is rebuilt after a learn at most this often: a build costs seconds of one core
MIN_RANGE = 1 << 12  # a kind's cells are built up to the next power of two over twice its longest prompt, at least this

Decided = tuple[int, Answer]  # a length and the recipe's answer there


def numeric_candidates(request: ChunkRequest) -> tuple[int, ...]:
    return tuple(sorted({int(c) for c in (request.candidates or DEFAULT_CHUNKS) if c != "full"}))


def cells(request: ChunkRequest, longest: int) -> list[tuple[int, int]]:
    """Every cell of the request's kind up to `longest`, from a seed in each (every short length,
    each edge and its neighbours, each grid point and its neighbours, each multiple of 1024)."""
    sizes, window = numeric_candidates(request), request.attention.window
    edges = {*sizes, *RULE_EDGES, *((window,) if window else ())}
    seeds = {*range(1, EXACT_BELOW + 1), *(e + d for e in edges for d in (-1, 0, 1))}
    points = (round(2 ** (j / CELLS)) for j in range(int(CELLS * math.log2(longest)) + 2))
    seeds |= {p + d for p in points for d in (-1, 0, 1)}
    seeds |= {m + d for m in range(2048, longest + 2, 1024) for d in (-1, 0, 1)}
    return sorted({length_cell(n, sizes, window) for n in seeds if 1 <= n <= longest})


def agree(low: Decided, high: Decided) -> bool:
    """Whether two lengths' answers are one decision: the same size, or each its whole prompt."""
    a, at_a, b, at_b = low[0], low[1].response.chunk_size, high[0], high[1].response.chunk_size
    return at_a == at_b or (at_a == a and at_b == b)


def answer_at(segment: Segment[Answer], n: int) -> Answer:
    """The segment's answer for a prompt of `n` tokens: its nearer end's, the whole prompt read as
    n, predictions scaled by n / end."""
    end, held = segment.nearer(n)
    answer = held.response
    f = n / end

    def moved(c: Candidate) -> dict[str, float]:
        return {"chunk_size": n if c.chunk_size == end else c.chunk_size, "predicted_ttft_ms": c.predicted_ttft_ms * f}

    response = ChunkResponse.model_validate(  # one validation of plain data: pydantic's fastest way in
        {
            "chunk_size": n if answer.chunk_size == end else answer.chunk_size,
            "predicted_ttft_ms": answer.predicted_ttft_ms * f,
            "top": [moved(c) for c in answer.top],
            "rule": moved(answer.rule),
            "anchor": {**moved(answer.anchor), "name": answer.anchor.name, "spec": answer.anchor.spec},
            "model_version": answer.model_version,
            "source": "table",
            "deferred": answer.deferred,
            "span": (segment.first, segment.last),
        }
    )
    return Answer(response, held.gains)  # relative: the end's hold here


@dataclass
class Kind:
    request: ChunkRequest  # one request of the kind: the others differ only in context length
    longest: int  # its segments are built up to here
    # (each segment's first length, the segments), sorted: one attribute, swapped whole by a build
    entries: tuple[list[int], list[Segment[Answer]]]
    generation: int  # the correction's state its answers were built with; -1: never built (or extended)
    asked: bool = True  # asked about since its last build: only such kinds are rebuilt after a learn
    built_at: float = -math.inf

    def segment(self, n: int) -> Segment[Answer] | None:
        starts, found = self.entries
        i = bisect.bisect_right(starts, n) - 1
        return found[i] if i >= 0 and found[i].last >= n else None  # a gap: lengths no candidate fits


class DecisionTable:
    """Kinds of request -> their segments' answers, and the thread that builds them."""

    def __init__(
        self, exact_answers: Callable[[ChunkRequest, list[int]], list[Answer | None]], builds: bool = True
    ) -> None:
        self.exact_answers = exact_answers  # the recipe's answers for a request's kind at many lengths at once
        self.builds = builds  # False: nothing is ever built, every lookup misses
        self.kinds: OrderedDict[str, Kind] = OrderedDict()
        self.generation = 0  # bumped by every learn: kinds built before it are rebuilt
        self.ready = threading.Condition()  # guards kinds and generation; the builder waits on it
        self.closed = False
        self.builder: threading.Thread | None = None
        self.built_s: deque[float] = deque(maxlen=256)  # seconds per kind built, the latest (the benchmark reads them)
        self.build_s_total = 0.0  # every build's seconds: what the tables have cost this process's cores

    def lookup(self, request: ChunkRequest) -> Answer | None:
        """The table's answer for the request, if its segment is built. A new kind, or a length past
        the built range, is queued."""
        key, n = request.kind(), request.context_length
        kind = self.kinds.get(key)
        if kind is None or n > kind.longest:
            self._want(key, request)
        else:
            kind.asked = True
        found = None if kind is None else kind.segment(n)
        return None if found is None else answer_at(found, n)

    def learnt(self) -> None:
        """The correction changed: the kinds asked about since they were built are rebuilt, each at
        most once per REBUILD_S (telemetry flows with every prefill), their old answers serving until then."""
        with self.ready:
            self.generation += 1
            self.ready.notify()

    def _want(self, key: str, request: ChunkRequest) -> None:
        if not self.builds:
            return
        with self.ready:
            kind = self.kinds.get(key)
            longest = min(max(MIN_RANGE, 1 << (2 * request.context_length - 1).bit_length()), MAX_CONTEXT)
            if kind is None:
                self.kinds[key] = Kind(request, longest, ([], []), -1)
                while len(self.kinds) > MAX_KINDS:
                    self.kinds.popitem(last=False)
            elif request.context_length > kind.longest:
                kind.longest, kind.generation = longest, -1
            else:
                return
            if self.builder is None:
                self.builder = threading.Thread(target=self._build_forever, name="decision-table", daemon=True)
                self.builder.start()
            self.ready.notify()

    def _next(self) -> Kind | None:
        """The kind to build now: one never built (or extended) first, then one asked about since a
        build with an older correction whose REBUILD_S have passed; None once closed."""
        with self.ready:
            while not self.closed:
                now = time.monotonic()
                kinds = list(self.kinds.values())
                first = next((k for k in kinds if k.generation == -1), None)
                if first is not None:
                    return first
                stale = [k for k in kinds if k.generation != self.generation and k.asked]
                due = [k for k in stale if now - k.built_at >= REBUILD_S]
                if due:
                    return due[0]
                wait = min((REBUILD_S - (now - k.built_at) for k in stale), default=None)
                self.ready.wait(wait)
            return None

    def _build_forever(self) -> None:
        while (kind := self._next()) is not None:
            generation, longest, start = self.generation, kind.longest, time.perf_counter()
            kind.asked = False
            found = self._segments(kind.request, longest)
            kind.entries = ([s.first for s in found], found)  # one swap: readers see the old answers or the new
            kind.generation = generation if kind.longest == longest else -1  # extended meanwhile: again
            kind.built_at = time.monotonic()
            self.built_s.append(time.perf_counter() - start)
            self.build_s_total += self.built_s[-1]

    def _segments(self, request: ChunkRequest, longest: int) -> list[Segment[Answer]]:
        """Every cell of the kind as segments, the recipe's decisions priced in a few batches (the
        cells' ends, then each round's midpoints); a cell no candidate fits is left out (the error
        is the request path's to give)."""
        return segments(lambda lengths: self.exact_answers(request, lengths), agree, cells(request, longest))

    def summary(self) -> dict:
        """What GET /v1/model shows: whether it builds, kinds known and built, segments built, the
        latest build's seconds."""
        kinds = list(self.kinds.values())
        return {
            "builds": self.builds,
            "kinds": len(kinds),
            "kinds_built": sum(k.generation != -1 for k in kinds),
            "segments": sum(len(k.entries[0]) for k in kinds),
            "last_build_s": round(self.built_s[-1], 3) if self.built_s else None,
            "build_s_total": round(self.build_s_total, 3),
        }

    def wait(self, timeout_s: float = 60.0) -> bool:
        """Block until every kind has been built at least once (tests and the benchmark); False on timeout."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.ready:
                if all(k.generation != -1 for k in self.kinds.values()):
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify()
