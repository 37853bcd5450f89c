"""A stream of requests served one after another. With `overlap`, request k+1 is tokenized and its
chunk decision fetched on a background thread while request k prefills, so neither sits on k+1's
critical path. Each TTFT counts from the moment the engine turns to that request (the previous one
has its first token), which is what a queued request waits for beyond the queue itself."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from .engine import Engine, TTFTResult
from .policy import ChunkPolicy
from .prefill import clock_ms
from .workload import Workload


def stream(
    engine: Engine, workloads: Sequence[Workload], policy: ChunkPolicy, overlap: bool = True
) -> Iterator[TTFTResult]:
    """Each workload's result as soon as it has its first token."""
    if not overlap:
        for w in workloads:
            yield engine.run(w, policy)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="chunkpilot-prepare") as pool:
        pending = pool.submit(engine.prepare, workloads[0], policy) if workloads else None
        for k in range(len(workloads)):
            started = clock_ms(engine.device)
            prepared = pending.result()  # the first request waits for all of it; later ones for what is left
            pending = pool.submit(engine.prepare, workloads[k + 1], policy) if k + 1 < len(workloads) else None
            yield engine.execute(prepared, policy, started)
