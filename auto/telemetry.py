"""Telemetry of the engine's own prefills under `auto`: each outcome goes into a bounded in-memory
queue that a background thread flushes in batches (to the service's /v1/feedback, or to a local
partition in --in-process mode). A prefill never waits: when the queue is full the outcome is
dropped and counted; a batch that cannot be delivered is dropped and counted too."""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from auto.connection import ServiceConnection
from chunkpilot import plausibility
from chunkpilot.contract import ChunkRequest, Outcome

if TYPE_CHECKING:
    from engine.engine import TTFTResult

Send = Callable[[list[dict]], None]  # delivers one batch or raises


@dataclass
class Reporter:
    send: Send
    capacity: int = 1024  # outcomes held at most; beyond that they are dropped, never the prefill
    batch: int = 16  # outcomes per request: 16 long prompts stay well inside the body limit
    interval_s: float = 1.0  # a partial batch waits at most this long
    sent: int = 0
    dropped: int = 0  # queue full, or the batch could not be delivered
    last_error: str | None = None
    _queue: queue.Queue = field(init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _count: threading.Lock = field(default_factory=threading.Lock, repr=False)  # both threads drop

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.capacity)
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def report(self, outcome: dict) -> bool:
        """Queue one outcome without waiting; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(outcome)
        except queue.Full:
            with self._count:
                self.dropped += 1
            return False
        return True

    def _take(self) -> list[dict]:
        try:
            items = [self._queue.get(timeout=self.interval_s)]
        except queue.Empty:
            return []
        while len(items) < self.batch:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            items = self._take()
            if not items:
                continue
            try:
                self.send(items)
                self.sent += len(items)
            except Exception as exc:  # the service down, a refusal, a full disk: counted, never raised
                with self._count:
                    self.dropped += len(items)
                self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (up to `timeout_s`), then stop the thread."""
        self._stop.set()
        self._thread.join(timeout_s)


def outcome(request: ChunkRequest, result: TTFTResult) -> dict:
    """One prefill as the contract's Outcome reads it; checked where it lands, not on this thread."""
    return {
        "request": request.model_dump(mode="json"),
        "chunk_size": result.chunk_size,
        "source": result.decision.source,
        "model_version": result.decision.model_version,
        "explored": result.decision.explored,
        "tokenize_ms": result.tokenize_ms,
        "prefill_ms": result.prefill_ms,
        "first_decode_ms": result.first_decode_ms,
        "ttft_ms": result.ttft_ms,
        "chunk_ms": result.chunk_ms,
        "finished_at": datetime.now(UTC).isoformat(),
    }


TOKEN_ENV = "CHUNKPILOT_ADMIN_TOKEN"  # the service's own setting: an engine beside it sends the same


def to_service(url: str, token: str | None = None, timeout_s: float = 2.0) -> Send:
    """Batches to the service's POST /v1/feedback, over a client of the reporter's own thread, with
    the bearer token (`token`, else $CHUNKPILOT_ADMIN_TOKEN) when there is one: a service that has a
    token accepts outcomes only with it."""
    token = token or os.environ.get(TOKEN_ENV) or None
    headers = {"authorization": f"Bearer {token}"} if token else {}
    client = ServiceConnection(url, timeout_s, headers)

    def send(batch: list[dict]) -> None:
        client.post("/v1/feedback", json.dumps({"outcomes": batch}).encode())

    return send


def to_partition(directory: Path) -> Send:
    """Batches checked against the contract and for plausibility (as the service checks them) and
    appended to a local telemetry partition (--in-process); a refused batch is dropped and counted."""
    from store.dataset import Partition

    partition = Partition(directory)

    def send(batch: list[dict]) -> None:
        outcomes = [plausibility.check(Outcome.model_validate(raw)) for raw in batch]
        partition.append(outcomes)

    return send
