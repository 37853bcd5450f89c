"""Is a reported prefill physically possible on the machine it claims? An outcome's chunk times
are what the correction and retraining learn from, so one that no machine could have measured is
refused before it teaches anything: a chunk may not compute faster than SLACK times the machine's
measured matmul peak allows (its projections and MLP alone, 2 FLOPs per weight per token: a lower
bound on its work), nor take less than 1/SLACK of the machine's measured per-forward overhead
(one token through a one-layer model: any chunk of any model does more).

SLACK is 2. Over the 3,192 shipped rows with chunk times (2026-12-07), the fastest chunk computed at
0.98x its machine's measured matmul peak and the shortest took 1.9x its per-forward overhead, so the
floor sits 2.0x and 3.7x below anything measured (tests/test_attacks.py checks every shipped row passes);
an outcome that claims more is refused, and what stays within it is bounded by the correction's clip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .chunks import uniform
from .contract import ConfigError, ModelShape, Outcome
from .features import linear_flops

SLACK = 2.0


def floor_ms(shape: ModelShape, descriptors: Mapping[str, float], tokens: int) -> float:
    """The least time a chunk of `tokens` query tokens can take on this machine."""
    work = linear_flops(
        tokens,
        shape.num_layers,
        shape.hidden_size,
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.intermediate_size,
    )
    compute = work / (SLACK * descriptors["matmul_gflops"] * 1e9) * 1e3
    return max(compute, descriptors["call_overhead_ms"] / SLACK)


def implausible(
    shape: ModelShape, descriptors: Mapping[str, float], context_length: int, chunk_size: int, chunk_ms: Sequence[float]
) -> str | None:
    """Why these chunk times cannot have been measured on this machine, or None."""
    for i, (tokens, ms) in enumerate(zip(uniform(context_length, chunk_size), chunk_ms, strict=True)):
        least = floor_ms(shape, descriptors, tokens)
        if ms < least:
            return (
                f"chunk {i} ({tokens} tokens) took {ms:.3g} ms, faster than this machine allows "
                f"(>= {least:.3g} ms at {SLACK:g}x its matmul_gflops and 1/{SLACK:g} of its call_overhead_ms)"
            )
    return None


def check(outcome: Outcome, descriptors: Mapping[str, float] | None = None) -> Outcome:
    """`outcome`, or ConfigError naming chunk_ms; `descriptors` the machine as the service knows it
    (its profiled measurement), else the outcome's own."""
    request = outcome.request
    machine = descriptors or request.hardware.model_dump()
    reason = implausible(request.shape, machine, request.context_length, outcome.chunk_size, outcome.chunk_ms)
    if reason is not None:
        raise ConfigError("chunk_ms", reason)
    return outcome
