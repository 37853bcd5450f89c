"""Chunk arithmetic, one place for each fact: the hand rule and the size it lands on, what a config
allows (ring: at most the window; at most the context), a size as a schedule, the candidates a
config can run, and the quarter-octave buckets of length that share a decision."""

from __future__ import annotations

import math

# chunk sizes profiled and predicted for by default ("full" = the whole prompt in one chunk)
DEFAULT_CHUNKS: tuple[int | str, ...] = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, "full")


def hand_rule(context_length: int) -> int:
    """The write-up's rule: the baseline to beat and the engine's fallback."""
    if context_length <= 512:
        return 512
    if context_length <= 1536:
        return 1024
    return 1024 if context_length % 1024 == 0 else 768


def max_chunk(context_length: int, window: int | None, layout: str) -> int:
    """The largest chunk that is both useful (<= context) and allowed (ring: <= window)."""
    return min(context_length, window) if layout == "ring" and window else context_length


def quarter_octave(context_length: int) -> int:
    """Lengths this close share a decision (the engine's answer cache) and a kind of request (exploring)."""
    return round(4 * math.log2(context_length))


def spread_positions(count: int, context_length: int) -> list[int]:
    """`count` global-token positions spread evenly over a prompt (the profiler's, and the engine's
    when only a count is given)."""
    return sorted({(i + 1) * context_length // (count + 1) for i in range(count)})


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


def rule_candidate(sizes: list[int], context_length: int, window: int | None, layout: str) -> int:
    """The candidate the hand rule lands on: its size cut to what the config allows, else the largest
    candidate below that, else the smallest. The one place the rule meets a list of candidates:
    training scores it, and the recipe's do-no-harm and the service's answer use it."""
    rule = rule_size(context_length, window, layout)
    below = [size for size in sizes if size <= rule]
    return max(below) if below else min(sizes)


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
