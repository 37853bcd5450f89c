"""A stream of requests served one after another. With `overlap`, request k+1 is tokenized and its
chunk decision fetched on a background thread while request k prefills, so neither sits on k+1's
critical path. Each TTFT counts from the moment the engine turns to that request (the previous one
has its first token), which is what a queued request waits for beyond the queue itself."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from chunkpilot.contract import AttentionConfig

from .engine import Engine, TTFTResult
from .global_tokens import GlobalTokens
from .policy import ChunkPolicy
from .prefill import clock_ms


@dataclass(frozen=True)
class StreamRequest:
    text: str
    max_tokens: int | None = None  # a cap on the text's tokens
    attention: AttentionConfig = AttentionConfig()
    global_tokens: GlobalTokens | None = None


def stream(
    engine: Engine, requests: Sequence[StreamRequest], policy: ChunkPolicy, overlap: bool = True
) -> Iterator[TTFTResult]:
    """Each request's result as soon as it has its first token."""
    if not overlap:
        for r in requests:
            yield engine.run(r.text, r.max_tokens, r.attention, policy, r.global_tokens)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="chunkpilot-prepare") as pool:

        def prepare(r: StreamRequest):
            return pool.submit(engine.prepare, r.text, r.max_tokens, r.attention, policy, r.global_tokens)

        pending = prepare(requests[0]) if requests else None
        for k in range(len(requests)):
            started = clock_ms(engine.device)
            prepared = pending.result()  # the first request waits for all of it; later ones for what is left
            pending = prepare(requests[k + 1]) if k + 1 < len(requests) else None
            yield engine.execute(prepared, policy, started)
