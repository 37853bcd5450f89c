"""The decision table: the recipe's answers per kind of request (everything but the context length)
as segments of lengths, so that most decisions cost a dict lookup and a bisection.

The recipe decides each cell of lengths (chunkpilot.chunks.length_cell) at its first and last
length; where the two disagree the choice flips inside, and the cell is halved until every
segment's ends agree (chunkpilot.chunks.segments), so that a flip is found where the recipe makes
it. A segment answers its ends' decision for every length in it, its predicted TTFTs the nearer
end's scaled by n / end (the lengths of a cell are within 1.1% of each other, a tenth of the
held-out TTFT error) and every candidate's predicted peak memory interpolated between its
ends. The table is the recipe's (estimator.recipe.Recipe.table): training's cross-validation asks
`Recipe.decide` as the service does, its cells built at once instead of in the background: what is
judged is what is served. A cell is built when a length in it is first asked (a few batched calls
of the cost model: milliseconds): in that very request where the service can afford it
(predictor.model.Predictor.answer: `build_now`), else by one background thread; a kind's built
cells are rebuilt in the background when the correction has learnt, the old answers serving
meanwhile.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from chunkpilot.chunks import DEFAULT_CHUNKS, Segment, length_cell, segments
from chunkpilot.contract import Candidate, ChunkRequest, Decision

from .decide import Infeasible, attach_gains, gains_of

MAX_KINDS = 64  # kinds kept (least recently asked go first): a client inventing kinds costs memory only so far
REBUILD_S = 30.0  # a kind's cells are rebuilt after a learn at most this often

Decided = tuple[int, Decision]  # a length and the recipe's decision there
DecideMany = Callable[[ChunkRequest, list[int]], list[Decision | Infeasible]]  # Recipe.decide_many


def untabled(request: ChunkRequest) -> bool:
    """What a decision table does not hold: a schedule (priced per length), a memory budget (the
    table holds the unconstrained decision); the recipe decides these at their length."""
    return request.schedule or request.memory_budget_mb is not None


def numeric_candidates(request: ChunkRequest) -> tuple[int, ...]:
    return tuple(sorted({int(c) for c in (request.candidates or DEFAULT_CHUNKS) if c != "full"}))


def cell_of(request: ChunkRequest) -> tuple[int, int]:
    """The cell of lengths the request's length falls in (chunkpilot.chunks.length_cell)."""
    return length_cell(request.context_length, numeric_candidates(request), request.attention.window)


def agree(low: Decided, high: Decided) -> bool:
    """Whether two lengths' answers are one decision: the same size, or each its whole prompt."""
    a, at_a, b, at_b = low[0], low[1].chunk_size, high[0], high[1].chunk_size
    return at_a == at_b or (at_a == a and at_b == b)


def _peaks(end: int, decision: Decision) -> dict[int | str, float | None]:
    """Each candidate's predicted peak at `end` by size ("full": the whole prompt)."""
    return {"full" if c.chunk_size == end else c.chunk_size: c.predicted_peak_mb for c in decision.candidates}


def answer_at(segment: Segment[Decision], n: int) -> Decision:
    """The segment's answer for a prompt of `n` tokens: its nearer end's, the whole prompt read as
    n, predicted TTFTs scaled by n / end, and each candidate's predicted peak linear between the
    two ends (exact where the peak grows linearly with the prompt: the KV cache, the keys a chunk
    scores)."""
    end, answer = segment.nearer(n)
    f = n / end
    (a, low), (b, high) = segment.low, segment.high
    t = 0.0 if a == b else (n - a) / (b - a)
    # no memory side (no margin): no peaks to interpolate, each candidate's stays None
    at_low, at_high = ({}, {}) if answer.memory_margin is None else (_peaks(a, low), _peaks(b, high))

    def moved(c: Candidate) -> dict[str, float]:
        return {"chunk_size": n if c.chunk_size == end else c.chunk_size, "predicted_ttft_ms": c.predicted_ttft_ms * f}

    def peaked(c: Candidate) -> dict[str, float | None]:
        key = "full" if c.chunk_size == end else c.chunk_size
        p, q = at_low.get(key), at_high.get(key)
        peak = c.predicted_peak_mb if p is None or q is None else p + t * (q - p)
        return {**moved(c), "predicted_peak_mb": peak}

    decision = Decision.model_validate(  # one validation of plain data: pydantic's fastest way in
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
            "candidates": [peaked(c) for c in answer.candidates],
            "memory_margin": answer.memory_margin,
        }
    )
    # relative: the end's hold here, the whole prompt moved to n as the candidates are
    gains = tuple(g._replace(chunk_size=n) if g.chunk_size == end else g for g in gains_of(answer))
    return attach_gains(decision, gains)


@dataclass
class Kind:
    request: ChunkRequest  # one request of the kind: the others differ only in context length
    # (each segment's first length, the segments), sorted: one attribute, swapped whole by a build
    entries: tuple[list[int], list[Segment[Decision]]]
    built: set[tuple[int, int]]  # the cells built (those no candidate fits too: they have no segment)
    wanted: set[tuple[int, int]]  # the cells asked about and not built yet
    generation: int  # the correction's state its cells were built with
    asked: bool = True  # asked about since its last build: only such kinds are rebuilt after a learn
    built_at: float = -math.inf

    def segment(self, n: int) -> Segment[Decision] | None:
        starts, found = self.entries
        i = bisect.bisect_right(starts, n) - 1
        return found[i] if i >= 0 and found[i].last >= n else None  # a gap: lengths not built, or no candidate fits


class DecisionTable:
    """Kinds of request -> their segments' answers, and the thread that builds them."""

    def __init__(self, decide_many: DecideMany, builds: bool = True) -> None:
        # the recipe's decisions for a request's kind at many lengths at once; weak, as the recipe
        # holds its table: no reference cycle keeps a fold's forests alive
        self._decide_many = weakref.WeakMethod(decide_many)
        self.builds = builds  # False: nothing is built in the background (only `build_now` builds)
        self.kinds: OrderedDict[str, Kind] = OrderedDict()
        self.generation = 0  # bumped by every learn: cells built before it are rebuilt
        self.ready = threading.Condition()  # guards kinds and generation; the builder waits on it
        self.closed = False
        self.builder: threading.Thread | None = None
        self.built_s: deque[float] = deque(maxlen=256)  # seconds per build, the latest (the benchmark reads them)
        # every background build's CPU seconds (its own thread's, not the wall clock, which also counts
        # the GIL held by the requests it overlaps): what the tables cost the cores besides the
        # requests that asked (a cell built in a request, build_now, is in that request's own time)
        self.build_s_total = 0.0

    def lookup(self, request: ChunkRequest, queue: bool = True) -> Decision | None:
        """The table's answer for the request, if its cell is built; a cell not built is queued
        (unless `queue` is off: the caller decides first and queues it after, `want`)."""
        key, n = request.kind(), request.context_length
        kind = self.kinds.get(key)
        found = None if kind is None else kind.segment(n)
        if found is None:
            if queue:
                self.want(request)
        else:
            kind.asked = True
        return None if found is None else answer_at(found, n)

    def want(self, request: ChunkRequest) -> None:
        """Queue the request's cell, unless built or queued already."""
        if not self.builds:
            return
        cell = cell_of(request)
        with self.ready:
            kind = self._kind(request)
            if cell in kind.built or cell in kind.wanted:
                return
            kind.wanted.add(cell)
            if self.builder is None:
                self.builder = threading.Thread(target=self._build_forever, name="decision-table", daemon=True)
                self.builder.start()
            self.ready.notify()

    def _kind(self, request: ChunkRequest) -> Kind:
        """The request's kind, known from now on (the least recently asked past MAX_KINDS forgotten);
        under `ready`."""
        kind = self.kinds.get(request.kind())
        if kind is None:
            kind = self.kinds[request.kind()] = Kind(request, ([], []), set(), set(), self.generation)
            while len(self.kinds) > MAX_KINDS:
                self.kinds.popitem(last=False)
        return kind

    def learnt(self) -> None:
        """The correction changed: the kinds asked about since they were built are rebuilt (their
        built cells), each at most once per REBUILD_S (telemetry flows with every prefill), their old
        answers serving until then."""
        with self.ready:
            self.generation += 1
            self.ready.notify()

    def _next(self) -> tuple[Kind, list[tuple[int, int]], int, bool] | None:
        """(a kind, the cells to build now, the generation they are built with, whether this rebuilds
        the kind after a learn): the cells asked about first (with the kind's generation, so that
        its older cells are still rebuilt when due), then the built cells of a kind asked about since
        a build with an older correction whose REBUILD_S have passed; None once closed."""
        with self.ready:
            while not self.closed:
                now = time.monotonic()
                kinds = list(self.kinds.values())
                first = next((k for k in kinds if k.wanted), None)
                if first is not None:
                    return first, sorted(first.wanted), first.generation if first.built else self.generation, False
                stale = [k for k in kinds if k.generation != self.generation and k.asked and k.built]
                due = [k for k in stale if now - k.built_at >= REBUILD_S]
                if due:
                    return due[0], sorted(due[0].built), self.generation, True
                wait = min((REBUILD_S - (now - k.built_at) for k in stale), default=None)
                self.ready.wait(wait)
            return None

    def _build_forever(self) -> None:
        while (task := self._next()) is not None:
            kind, cells, generation, rebuild = task
            start, cpu = time.perf_counter(), time.thread_time()
            if rebuild:
                kind.asked = False
            try:
                found = self._segments(kind.request, cells)
            except Exception:  # a build that fails leaves its cells to the request path, never the thread dead
                found = []
            # counted before the cells are kept: whoever sees them built (`wait`) sees their cost
            self.built_s.append(time.perf_counter() - start)
            self.build_s_total += time.thread_time() - cpu
            self._keep(kind, cells, found, generation)
            if rebuild:
                kind.built_at = time.monotonic()

    def _segments(self, request: ChunkRequest, cells: list[tuple[int, int]]) -> list[Segment[Decision]]:
        """The cells' segments for the request's kind (no segment where no candidate fits)."""

        def decided(lengths: list[int]) -> list[Decision | None]:
            return [None if isinstance(d, Infeasible) else d for d in self._decide_many()(request, lengths)]

        return segments(decided, agree, cells)

    def _keep(self, kind: Kind, cells: list[tuple[int, int]], found: list[Segment[Decision]], generation: int) -> None:
        with self.ready:
            kept = [s for s in kind.entries[1] if not any(c[0] <= s.first <= c[1] for c in cells)]
            merged = sorted([*kept, *found], key=lambda s: s.first)
            kind.entries = ([s.first for s in merged], merged)  # one swap: readers see the old or the new
            kind.built |= set(cells)
            kind.wanted -= set(cells)
            kind.generation = generation

    def build_now(self, request: ChunkRequest) -> Decision | None:
        """The request's cell built in this thread if it is not yet, and the table's answer (None:
        no candidate fits there): what cross-validation asks, and the service where it can afford to
        decide now (predictor.model.Predictor.answer)."""
        cell = cell_of(request)
        with self.ready:
            kind = self._kind(request)
            # a kind with cells built keeps their generation, as the builder's first cells do: a
            # learn's rebuild of its older cells stays due
            generation = kind.generation if kind.built else self.generation
            built = cell in kind.built
        if not built:
            self._keep(kind, [cell], self._segments(kind.request, [cell]), generation)
        return self.lookup(request, queue=False)

    def summary(self) -> dict:
        """What GET /v1/model shows: whether it builds, kinds known and built, segments built, the
        latest build's seconds."""
        kinds = list(self.kinds.values())
        return {
            "builds": self.builds,
            "kinds": len(kinds),
            "kinds_built": sum(not k.wanted for k in kinds),
            "segments": sum(len(k.entries[0]) for k in kinds),
            "last_build_s": round(self.built_s[-1], 3) if self.built_s else None,
            "build_s_total": round(self.build_s_total, 3),
        }

    def wait(self, timeout_s: float = 60.0) -> bool:
        """Block until every cell asked about is built (tests and the benchmark); False on timeout."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.ready:
                if not any(k.wanted for k in self.kinds.values()):
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify()
