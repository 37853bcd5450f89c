"""The engine: a loaded model, its tokenizer and runtime set-up; runs and measures one request."""

from __future__ import annotations

import copy
import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch

from chunkpilot.chunks import spread_positions, uniform
from chunkpilot.contract import AttentionConfig, Backend, ChunkRequest, ConfigError, Decision, Hardware, number

from . import runtime
from .config import EngineConfig
from .hardware import local_hardware, this_machine
from .kv_cache import ChunkCache
from .measure import interleaved
from .memory import peak_above
from .models import load_model
from .policy import ChunkPolicy
from .prefill import clock_ms, decode_one_token, prefill
from .tokenizer import load_tokenizer, synthetic_text
from .workload import Workload


@dataclass(frozen=True)
class Prepared:
    """A request ready to prefill: its tokens and chunk decision, and what each took to get."""

    ids: torch.Tensor  # [1, N]
    request: ChunkRequest
    decision: Decision
    tokenize_ms: float
    decision_ms: float
    global_positions: list[int]  # tokens every later query sees besides the window


@dataclass(frozen=True)
class Prefilled:
    """What a backend's prefill and first token gave: the part of a request each backend does its own way."""

    first_token: int
    first_logits: torch.Tensor  # [V]
    chunk_ms: list[float]  # each chunk's ms, where the backend shows its chunks (else empty)
    prefill_ms: float
    first_decode_ms: float
    kv_cache_bytes: int


@dataclass
class TTFTResult:
    context_length: int
    chunk_size: int  # a schedule's first chunk
    schedule: list[int] | None  # the chunk sizes, when the policy chose a schedule
    global_tokens: int  # tokens every later query saw besides the window (selective SWA)
    num_chunks: int
    decision: Decision  # the policy's, whole: where it came from, the model version, a fallback's reason
    first_token: int
    tokenize_ms: float
    decision_ms: float
    prefill_ms: float
    first_decode_ms: float
    ttft_ms: float
    chunk_ms: list[float]
    kv_cache_bytes: int
    peak_memory_bytes: int
    first_logits: torch.Tensor = field(repr=False)  # [V], for exactness checks; not serialised

    def to_dict(self) -> dict:
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("first_logits", "decision")}
        return {**copy.deepcopy(plain), "decision": self.decision.model_dump(mode="json")}


TIMING_FIELDS = ("tokenize_ms", "decision_ms", "prefill_ms", "first_decode_ms", "ttft_ms")


@dataclass
class Measurement:
    """Repeats of one request after a warm-up; medians are per field over the repeats."""

    runs: list[TTFTResult]

    @property
    def median(self) -> dict[str, float]:
        return {name: statistics.median(getattr(r, name) for r in self.runs) for name in TIMING_FIELDS}

    def to_dict(self) -> dict:
        """The first run's request and decision fields, the medians, and every repeat."""
        shared = {k: v for k, v in self.runs[0].to_dict().items() if k not in (*TIMING_FIELDS, "chunk_ms")}
        peak = max(r.peak_memory_bytes for r in self.runs)
        return {**shared, "peak_memory_bytes": peak, "median": self.median, "repeats": [r.to_dict() for r in self.runs]}


class Engine:
    """The bundled engine; engine.backends holds the others (they load the same model and tokenizer,
    and replace only the prefill). Build one for a config with engine.backends.open_engine."""

    backend: ClassVar[Backend] = "chunkpilot"

    def __init__(self, config: EngineConfig) -> None:
        if config.backend != self.backend:
            raise ConfigError(
                "backend", f"{type(self).__name__} runs {self.backend}: open {config.backend} with open_engine"
            )
        self.config = config
        runtime.configure(config.threads, config.device)
        self.device = torch.device(config.device)
        self.loaded = load_model(config.model, config.dtype, config.seed, config.device)
        self.model = self.loaded.model
        if config.compile:
            self.model.forward = torch.compile(self.model.forward, dynamic=True)
        self.shape = self.loaded.shape
        self.tokenizer = load_tokenizer(self.loaded.checkpoint, self.shape.vocab_size)
        # a few lengths and seeds at a time: the comparison's prompts, a stream's, a profiled config's
        self._synthetic = functools.lru_cache(maxsize=64)(functools.partial(synthetic_text, self.tokenizer))

    @property
    def backend_version(self) -> str | None:
        """The backend's own version, where it is not this engine's (the dataset's harness_version)."""
        return None

    @property
    def runtime(self) -> runtime.RuntimeInfo:
        return runtime.current()  # a profiling worker changes threads between configs

    def hardware(self) -> Hardware:
        """This machine at the engine's dtype, threads and device, as `auto` describes it to the service
        (measured once into the per-user cache)."""
        return local_hardware(self.config.dtype, self.runtime.threads, self.config.device)

    def text(self, workload: Workload) -> str:
        """The words to tokenize, made before the clock starts: a synthetic text is made once per
        (length, seed) and kept, so repeats and rounds of a workload pay for it once."""
        if workload.text is not None:
            return workload.text
        if workload.context_length is None:
            raise ConfigError("prompt", "give a text, a file or a context length")
        return self._synthetic(self.check_context(workload.context_length), workload.seed)

    def check_context(self, n: int) -> int:
        """A prompt of n tokens plus the first decode step must fit the model's positions."""
        return number("context_length", n, int, ge=1, le=self.shape.max_position - 1)

    def request(self, context_length: int, attention: AttentionConfig) -> ChunkRequest:
        """What the policy is asked about a prompt of this length and attention on this engine."""
        return ChunkRequest(
            context_length=context_length,
            model=self.shape,
            attention=attention,
            dtype=self.config.dtype,
            threads=self.runtime.threads,
            attn_impl=self.config.attn_impl,
            backend=self.backend,
            quant=self.config.quant if self.backend == "llama.cpp" else None,
            memory_budget_mb=self.config.memory_budget_mb,
            hardware=this_machine(self.config.device),
        )

    def batch_tokens(self, chunk: int) -> int | None:
        """The tokens one forward holds at most when prefilling in `chunk`s, where the backend sizes
        its buffers by it (llama.cpp's n_batch and n_ubatch); None where it does not."""
        return None

    def run(self, workload: Workload, policy: ChunkPolicy) -> TTFTResult:
        """One request, timed: tokenize, ask the policy, prefill in chunks, first decode step."""
        self.text(workload)  # synthetic words are made before the clock
        started = clock_ms(self.device)
        return self.execute(self.prepare(workload, policy), policy, started)

    def prepare(self, workload: Workload, policy: ChunkPolicy) -> Prepared:
        """Tokenize, find the global tokens (`workload.global_tokens`, else `attention.global_tokens`
        spread evenly) and ask the policy: what a stream does for the next request during this one's prefill."""
        text, attention = self.text(workload), workload.attention
        t0 = clock_ms(self.device)
        ids = self.tokenizer.encode(text).ids[: workload.context_length]
        tensor = torch.tensor([ids], device=self.device)  # [1, N]
        t1 = clock_ms(self.device)
        n = self.check_context(len(ids))
        if workload.global_tokens is None:
            positions = spread_positions(attention.global_tokens, n)
        else:
            positions = workload.global_tokens.resolve(ids, lambda marker: self.tokenizer.encode(marker).ids)
            attention = AttentionConfig(**{**attention.model_dump(), "global_tokens": len(positions)})
        request = self.request(n, attention)
        decision = policy.decide(request)
        return Prepared(tensor, request, decision, t1 - t0, clock_ms(self.device) - t1, positions)

    def execute(self, prepared: Prepared, policy: ChunkPolicy, started: float) -> TTFTResult:
        """Prefill in chunks and the first token; TTFT counts from `started` (clock_ms), the moment
        the request's turn began, so preparation done before it is not counted."""
        runtime.reset_peak_memory(self.device)
        request, decision = prepared.request, prepared.decision
        n = request.context_length
        chunks = decision.schedule or uniform(n, min(decision.chunk_size, n))
        request.attention.check_schedule(chunks, n)
        done = self.to_first_token(prepared, chunks)
        result = TTFTResult(
            context_length=n,
            chunk_size=chunks[0],
            schedule=list(decision.schedule) if decision.schedule else None,
            global_tokens=len(prepared.global_positions),
            num_chunks=len(chunks),
            decision=decision,
            first_token=done.first_token,
            tokenize_ms=prepared.tokenize_ms,
            decision_ms=prepared.decision_ms,
            prefill_ms=done.prefill_ms,
            first_decode_ms=done.first_decode_ms,
            ttft_ms=clock_ms(self.device) - started,
            chunk_ms=done.chunk_ms,
            kv_cache_bytes=done.kv_cache_bytes,
            peak_memory_bytes=runtime.peak_memory_bytes(self.device),
            first_logits=done.first_logits,
        )
        policy.observe(request, result)  # a learning policy hears how its choice went (after the clock)
        return result

    def new_cache(self, prepared: Prepared) -> ChunkCache:
        """The request's KV cache, told the tokens it will see (the prompt and the first decode step)."""
        n = prepared.request.context_length
        return ChunkCache(self.shape.local_layers, prepared.request.attention, prepared.global_positions, n + 1)

    @torch.inference_mode()
    def to_first_token(self, prepared: Prepared, chunks: Sequence[int]) -> Prefilled:
        """The bundled engine's: its own loop over its own KV cache, then the first decode step."""
        t2 = clock_ms(self.device)
        n = prepared.request.context_length
        cache = self.new_cache(prepared)
        logits, chunk_ms = prefill(self.model, cache, prepared.ids, chunks, self.config.attn_impl)
        first = logits.argmax(-1)  # [1]
        t3 = clock_ms(self.device)
        decode_one_token(self.model, cache, first, n, self.config.attn_impl)
        t4 = clock_ms(self.device)
        return Prefilled(int(first), logits[0].float(), chunk_ms, t3 - t2, t4 - t3, cache.nbytes)

    def prefill_memory(self, workload: Workload, policy: ChunkPolicy) -> int:
        """Bytes one prefill of `workload` (to the first token) adds at its peak above the loaded
        model, measured by an untimed run (engine.memory)."""
        return peak_above(lambda: self.run(workload, policy), self.device)

    def measure(self, workload: Workload, policy: ChunkPolicy, repeats: int = 3, warmup: int = 1) -> Measurement:
        number("repeats", repeats, int, ge=1, le=1000)
        runs = interleaved({policy.name: lambda: self.run(workload, policy)}, repeats, warmup)
        return Measurement(runs[policy.name])
