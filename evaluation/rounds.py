"""Chunk sizes measured the evaluator's way: each size of a workload a step that times one prefill
at that size, steps interleaved and rotated over rounds (engine.measure.interleaved), so that drift
hits every size alike."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks
from engine.engine import Engine
from engine.measure import interleaved
from engine.policy import FixedPolicy
from engine.workload import Workload
from judge.regret import Choices


def every_size(workload: Workload) -> list[int]:
    """The default candidates the workload can run (ring: up to the window; `full`: its length)."""
    att = workload.attention
    return feasible_chunks(DEFAULT_CHUNKS, workload.context_length, att.window, att.layout)[0]


def ttft_ms(engine: Engine, workload: Workload, size: int) -> float:
    return engine.run(workload, FixedPolicy(size)).ttft_ms


def steps(engine: Engine, workload: Workload, sizes: list[int]) -> dict[int, Callable[[], float]]:
    """Size -> one timed prefill of the workload at it."""
    return {c: functools.partial(ttft_ms, engine, workload, c) for c in sizes}


def time_sizes(engine: Engine, workload: Workload, rounds: int) -> dict[int, list[float]]:
    """Every size of the workload, `rounds` interleaved rounds after a warm-up: size -> TTFT ms per round."""
    return interleaved(steps(engine, workload, every_size(workload)), rounds)


def timed(decide: Callable[[int], int], probes: range) -> Choices:
    """Each probe's choice by `decide(probe index)`, and the time that decision took: what a policy
    is charged on top of the TTFT of its size (the net regret, judge.regret)."""
    sizes, ms = {}, {}
    for i in probes:
        start = time.perf_counter()
        sizes[i] = decide(i)
        ms[i] = (time.perf_counter() - start) * 1e3
    return sizes, ms
