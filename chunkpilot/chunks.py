"""Chunk arithmetic, one place for each fact: the hand rule and the size it lands on, what a config
allows (ring: at most the window; at most the context), a size as a schedule, the candidates a
config can run, the quarter-octave buckets of length that share a decision, and the cells and
segments of lengths a decision table answers alike."""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterable
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")
N = TypeVar("N")  # a number, or a numpy array of them (this module imports no numpy)

# chunk sizes profiled and predicted for by default ("full" = the whole prompt in one chunk)
MAX_CONTEXT = 1 << 20  # the longest prompt, window or chunk any part accepts
DEFAULT_CHUNKS: tuple[int | str, ...] = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, "full")


# The write-up's hand rule, the one place of its thresholds: up to each length, its size; a longer
# prompt takes ALIGNED when it is a multiple of ALIGNED, else UNALIGNED
HAND_RULE: tuple[tuple[int, int], ...] = ((512, 512), (1536, 1024))
ALIGNED, UNALIGNED = 1024, 768
LONG = HAND_RULE[-1][0]  # beyond it, the alignment decides


def hand_rule(context_length: int) -> int:
    """The write-up's rule: one of the baselines `auto` is judged against (judge.lineup)."""
    for longest, size in HAND_RULE:
        if context_length <= longest:
            return size
    return ALIGNED if context_length % ALIGNED == 0 else UNALIGNED


def describe_hand_rule() -> str:
    steps = "; ".join(f"{size} up to {longest} tokens" for longest, size in HAND_RULE)
    return f"{steps}; beyond that {ALIGNED} on multiples of {ALIGNED}, else {UNALIGNED}"


def max_chunk(context_length: int, window: int | None, layout: str) -> int:
    """The largest chunk that is both useful (<= context) and allowed (ring: <= window)."""
    return min(context_length, window) if layout == "ring" and window else context_length


def spread_positions(count: int, context_length: int) -> list[int]:
    """`count` global-token positions spread evenly over a prompt (the profiler's, and the engine's
    when only a count is given)."""
    return sorted({(i + 1) * context_length // (count + 1) for i in range(count)})


def chunk_count(context_length: N, chunk: N) -> N:
    """How many chunks of `chunk` tokens cover the prompt: ints, floats or numpy arrays alike (the
    features' columns), exact where n / c would round."""
    return -(-context_length // chunk)


def last_chunk(context_length: N, chunk: N) -> N:
    """The last chunk's tokens: what is left after the full ones (`chunk` itself when it divides)."""
    return context_length - (chunk_count(context_length, chunk) - 1) * chunk


def uniform(context_length: int, chunk: int) -> list[int]:
    """One chunk size as a schedule: chunks of `chunk` tokens, the last one what is left."""
    whole, rest = divmod(context_length, chunk)
    return [chunk] * whole + ([rest] if rest else [])


def clamp_chunk(chunk: int, context_length: int, window: int | None, layout: str) -> int:
    """`chunk` cut to what the config allows: how the engine applies a fixed size, the hand rule or
    a cached answer, and how training and the profiler's summary score them."""
    return min(chunk, max_chunk(context_length, window, layout))


def rule_size(context_length: int, window: int | None, layout: str) -> int:
    """The hand rule's size as the engine applies it: cut to what the config allows."""
    return clamp_chunk(hand_rule(context_length), context_length, window, layout)


def simple_rule(context_length: int, window: int | None, layout: str) -> int:
    """The strongest two-line rule found on the shipped data, the baseline `auto` must beat beside
    the hand rule: one shot without a window (the whole prompt in one causal pass skips the masked
    half), else the hand rule."""
    return context_length if window is None else rule_size(context_length, window, layout)


def landed(sizes: Iterable[int], chunk: int) -> int:
    """The candidate a size lands on among `sizes` (those measured, or offered): itself, else the
    largest below it, else the smallest. How a fixed size or a rule is scored on measured data,
    one way for the profiler's summary and for training."""
    sizes = [int(size) for size in sizes]
    below = [size for size in sizes if size <= chunk]
    return max(below) if below else min(sizes)


def rule_candidate(sizes: Iterable[int], context_length: int, window: int | None, layout: str) -> int:
    """The candidate the hand rule lands on: training scores it, and the service's answer states it."""
    return landed(sizes, rule_size(context_length, window, layout))


def feasible_chunks(
    sizes: tuple[int | str, ...], context_length: int, window: int | None, layout: str
) -> tuple[list[int], list[str]]:
    """(the sizes a config can run, sorted, `full` being the context; a reason for each other)."""
    chosen: list[int] = []
    skipped: list[str] = []
    for size in sizes:
        chunk = context_length if size == "full" else int(size)
        if chunk > context_length:
            skipped.append(f"{size}: larger than the context ({context_length})")
        elif layout == "ring" and window and chunk > window:
            skipped.append(f"{size}: ring layout needs chunk <= window ({window})")
        elif chunk not in chosen:
            chosen.append(chunk)
    return sorted(chosen), skipped


# The decision table's resolution: lengths within 1/CELLS of an octave (about 1.1% apart) share a
# cell, and a cell whose two ends the recipe decides alike answers that decision for every length
# in it (estimator.table). At 32 a choice flipped twice inside one cell on 1 of 338 configs of the
# shipped data, at 64 on none (tests/test_table.py)
CELLS = 64
EXACT_BELOW = 128  # shorter prompts are their own cells: a grid finer than one token gains nothing
# where the hand rule changes its size or lands on another candidate (HAND_RULE above): lengths
# on either side are kept apart
RULE_EDGES = tuple(sorted({*(n for n, _ in HAND_RULE), *(c for _, c in HAND_RULE), ALIGNED, UNALIGNED}))


@functools.lru_cache(maxsize=1024)
def _edges(sizes: tuple[int, ...], window: int | None) -> tuple[int, ...]:
    return tuple(sorted({*sizes, *RULE_EDGES, *((window,) if window else ())}))


def _own_cell(n: int) -> bool:
    return n < EXACT_BELOW or (n > LONG and n % ALIGNED == 0)


def length_cell(context_length: int, sizes: tuple[int, ...], window: int | None) -> tuple[int, int]:
    """(first, last) length of the cell `context_length` falls in: the lengths that round to the
    same point of a grid of CELLS per octave and lie strictly between the same two edges, where the
    candidates, the ring's limit or the hand rule change (a candidate's own size, the window,
    RULE_EDGES), so that every length of a cell has the same feasible candidates (`full` aside) and
    the same rule candidate. An edge, a multiple of ALIGNED above LONG (the hand rule's own
    case) and any length under EXACT_BELOW is a cell of its own. `sizes`: the numeric candidates, sorted."""
    n = context_length
    if _own_cell(n):
        return n, n
    edges = _edges(sizes, window)
    i = bisect.bisect_left(edges, n)
    if i < len(edges) and edges[i] == n:
        return n, n
    lo = edges[i - 1] if i else 0
    hi = edges[i] if i < len(edges) else MAX_CONTEXT + 1
    if n > LONG:  # the multiples of ALIGNED on either side are edges too
        lo, hi = max(lo, n // ALIGNED * ALIGNED), min(hi, (n // ALIGNED + 1) * ALIGNED)
    j = round(CELLS * math.log2(n))
    first = min(max(math.ceil(2 ** ((j - 0.5) / CELLS)), lo + 1), n)
    last = max(min(math.ceil(2 ** ((j + 0.5) / CELLS)) - 1, hi - 1), n)
    return first, last


class Segment(NamedTuple, Generic[T]):
    """Lengths first..last on which a decision is one (a decision table's entry, estimator.table):
    decided at `low` and at `high`, (length, answer) pairs at or just outside its ends that agree."""

    first: int
    last: int
    low: tuple[int, T]
    high: tuple[int, T]

    def nearer(self, n: int) -> tuple[int, T]:
        """The decided end nearer `n` (in log length): the one to read n's answer from."""
        return self.low if math.log(n / self.low[0]) <= math.log(self.high[0] / n) else self.high


def segments(
    decide: Callable[[list[int]], list[T | None]],
    agree: Callable[[tuple[int, T], tuple[int, T]], bool],
    cells: Iterable[tuple[int, int]],
) -> list[Segment[T]]:
    """Each cell (first, last) of lengths as segments of one decision, in order of length: decided
    at its two ends, and where they disagree the choice flips in between, so the lengths are halved
    (one decision each) until every segment's ends agree or it is one length; each length gets the
    decision taken at it wherever a flip is found. `decide` takes many lengths at once (every cell's
    ends, then each round's midpoints: a few batched calls, not one per length) and says None for a
    length it has no decision for (no candidate fits, a prediction not finite): that length's cell is
    left out, the error being the request path's to give."""
    cells = list(cells)
    known: dict[int, T | None] = {}

    def decided(lengths: Iterable[int]) -> None:
        todo = sorted(set(lengths) - known.keys())
        if todo:
            known.update(zip(todo, decide(todo), strict=True))

    decided(n for cell in cells for n in cell)
    found: dict[int, list[Segment[T]]] = {first: [] for first, _ in cells}  # by cell (its first length)
    # (its cell, first length, (a, decision at a), (b, decision at b)): a segment still to settle
    pending = [(first, first, (first, known[first]), (last, known[last])) for first, last in cells]
    while pending:
        split = []
        for cell, first, low, high in pending:
            (a, _), (b, _) = low, high
            if cell not in found:  # left out already
                continue
            if low[1] is None or high[1] is None:  # no decision there (no candidate fits; not finite)
                del found[cell]
            elif agree(low, high):
                found[cell].append(Segment(first, b, low, high))
            elif b - a <= 1:
                if first <= a:
                    found[cell].append(Segment(a, a, low, low))
                found[cell].append(Segment(b, b, high, high))
            else:
                split.append((cell, first, low, high, (a + b) // 2))
        decided(m for *_, m in split)
        pending = []
        for cell, first, low, high, m in split:
            mid = (m, known[m])
            pending += [(cell, first, low, mid), (cell, m + 1, mid, high)]
    return sorted((s for made in found.values() for s in made), key=lambda s: s.first)
