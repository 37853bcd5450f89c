"""The `auto` chunk-size policy: the engine's only way to the predictor. It asks the service over
HTTP (keep-alive, short timeout), caches answers per request bucket, and falls back to the hand
rule on a timeout, connection error, 5xx or an infeasible answer; a circuit breaker stops asking
after repeated failures and probes again later. An in-process variant loads the model itself."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from chunkpilot.config import RequestFeatures

from .policy import Decision, RulePolicy


def bucket(request: RequestFeatures) -> tuple:
    """Requests that get one answer: same everything, context within a quarter octave."""
    return (round(4 * math.log2(request.context_length)), request.shape, request.attention,
            request.dtype, request.threads, request.attn_impl)


def request_body(request: RequestFeatures, hardware: dict) -> dict:
    att = request.attention
    return {
        "context_length": request.context_length,
        "model": asdict(request.shape),
        "attention": {"window": att.window, "layout": att.layout, "sinks": att.sinks},
        "dtype": request.dtype, "threads": request.threads, "attn_impl": request.attn_impl,
        "hardware": hardware,
    }


def local_hardware(hardware_dir: Path = Path("data/hardware"), dtype: str = "float32", threads: int = 1) -> dict:
    """This machine as the service knows machines: its hardware_id, plus its measured descriptors
    when `chunkpilot profile` has cached them here (so an unprofiled id still gets an answer)."""
    from .hardware import fingerprint

    fp = fingerprint()
    cached = hardware_dir / f"{fp['hardware_id']}.json"
    found = {"hardware_id": fp["hardware_id"]}
    if cached.is_file():
        measured = json.loads(cached.read_text())
        key = f"{dtype}/{threads}" if f"{dtype}/{threads}" in measured else next(iter(measured), None)
        if key:
            found.update(measured[key], cores=fp["cores"], l2_cache_bytes=fp["l2_cache_bytes"],
                         l3_cache_bytes=fp["l3_cache_bytes"])
    return found


@dataclass
class Breaker:
    """Closed until `failures` in a row; then open for `cooldown_s`; then one probe decides."""

    failures: int = 3
    cooldown_s: float = 10.0
    streak: int = 0
    opened_at: float | None = None

    def allows(self) -> bool:
        return self.opened_at is None or time.monotonic() - self.opened_at >= self.cooldown_s

    def record(self, ok: bool) -> None:
        if ok:
            self.streak, self.opened_at = 0, None
        else:
            self.streak += 1
            if self.streak >= self.failures:
                self.opened_at = time.monotonic()  # (re)open: a failed probe waits a full cooldown again

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None


@dataclass
class AutoPolicy:
    url: str = "http://127.0.0.1:8000"
    timeout_s: float = 0.05
    hardware: dict = field(default_factory=dict)
    breaker: Breaker = field(default_factory=Breaker)
    name: str = "auto"

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=self.timeout_s)  # keep-alive across prefills
        self.answers: dict[tuple, tuple[int, str]] = {}
        self.fallback = RulePolicy()

    def choose(self, request: RequestFeatures) -> Decision:
        t0 = time.perf_counter()
        key = bucket(request)
        if key in self.answers:
            chunk, version = self.answers[key]
            return Decision(min(chunk, request.max_chunk), "cache", (time.perf_counter() - t0) * 1e3, version)
        if self.breaker.allows():
            try:
                chunk, version = self._ask(request)
                self.breaker.record(True)
                self.answers[key] = (chunk, version)
                return Decision(chunk, "service", (time.perf_counter() - t0) * 1e3, version)
            except (httpx.HTTPError, ValueError, KeyError, TypeError):  # timeout, refused, 5xx, garbage
                self.breaker.record(False)
        rule = self.fallback.choose(request)
        return Decision(rule.chunk_size, "fallback", (time.perf_counter() - t0) * 1e3, None)

    def _ask(self, request: RequestFeatures) -> tuple[int, str]:
        response = self.client.post("/v1/chunk-size", json=request_body(request, self.hardware))
        response.raise_for_status()
        answer = response.json()
        chunk = answer["chunk_size"]
        if not isinstance(chunk, int) or not 1 <= chunk <= request.max_chunk:
            raise ValueError(f"infeasible answer {chunk!r} (allowed 1..{request.max_chunk})")
        return chunk, str(answer["model_version"])

    def close(self) -> None:
        self.client.close()


@dataclass
class InProcessPolicy:
    """The same decision without HTTP: the registered model loaded into this process."""

    tracking_uri: str
    hardware: dict
    model_name: str = "chunk-size-predictor"
    alias: str = "champion"
    name: str = "auto"

    def __post_init__(self) -> None:
        from predictor.model import load_predictor

        self.predictor = load_predictor(self.tracking_uri, self.model_name, self.alias)

    def choose(self, request: RequestFeatures) -> Decision:
        from predictor.model import Infeasible
        from predictor.schemas import ChunkRequest

        t0 = time.perf_counter()
        try:
            decision = self.predictor.decide(ChunkRequest.model_validate(request_body(request, self.hardware)))
        except (Infeasible, ValueError):  # the rule always has an answer
            rule = RulePolicy().choose(request)
            return Decision(rule.chunk_size, "fallback", (time.perf_counter() - t0) * 1e3, None)
        return Decision(decision.chunk_size, "in-process", (time.perf_counter() - t0) * 1e3, decision.model_version)
