"""Measuring one config in a worker: every feasible chunk size, interleaved over repeats after a
warm-up, re-measured while noisy; one row per chunk size."""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime

import pandas as pd

from chunkpilot.chunks import chunk_count, last_chunk
from chunkpilot.features import prefill_flops
from engine import runtime
from engine.backends import open_engine
from engine.config import EngineConfig
from engine.contention import ForeignLoad
from engine.engine import Engine
from engine.hardware import matmul_peak
from engine.measure import interleaved, spread
from engine.policy import FixedPolicy
from store.dataset import HARNESS_VERSION, contended_limit

from .spec import ProfileConfig, Spec


class EnginePool:
    """Engines by (model, dtype, attn_impl, backend), the last few kept: loading a model costs seconds."""

    def __init__(self, device: str = "cpu", keep: int = 2) -> None:
        self.device, self.keep = device, keep
        self.engines: dict[tuple, Engine] = {}

    def get(self, config: ProfileConfig) -> Engine:
        key = (config.model, config.dtype, config.attn_impl, config.backend, config.quant)
        if key not in self.engines:
            while len(self.engines) >= self.keep:
                self.engines.pop(next(iter(self.engines)))
            self.engines[key] = open_engine(
                EngineConfig(
                    model=config.model,
                    dtype=config.dtype,
                    threads=config.threads,
                    attn_impl=config.attn_impl,
                    device=self.device,
                    backend=config.backend,
                    quant=config.quant or "f32",
                )
            )
        runtime.configure(config.threads, self.device)
        self.engines[key] = self.engines.pop(key)  # most recently used last
        return self.engines[key]


def measure_config(
    pool: EnginePool, config: ProfileConfig, spec: Spec, hardware: dict, deadline: float | None = None
) -> pd.DataFrame:
    """The config's rows: `spec.warmup` + `spec.repeats` interleaved passes over its chunk sizes, and
    up to `spec.max_remeasure` more sets of passes while it is noisy (added) or timed beside other
    work (replacing those passes), none that would end after `deadline` (time.time()): a budgeted
    sweep keeps a noisy config marked noisy instead of overrunning."""
    engine = pool.get(config)
    chunks, _ = config.candidates(spec.chunk_sizes)
    n, attention, workload = config.context_length, config.attention, config.workload
    engine.text(workload)  # the synthetic words, before the clock
    started = datetime.now(UTC)
    steps = {c: lambda c=c: engine.run(workload, FixedPolicy(c)) for c in chunks}
    t0 = time.time()
    with ForeignLoad() as load:
        runs = interleaved(steps, spec.repeats, spec.warmup)
    foreign = load.cores
    per_pass = (time.time() - t0) / (spec.warmup + spec.repeats)
    remeasured, limit = 0, contended_limit()
    while True:
        cv = statistics.median(spread([r.ttft_ms for r in runs[c]])[1] for c in chunks)
        beside_other_work = (foreign or 0.0) > limit
        if cv <= spec.cv_threshold and not beside_other_work:
            break
        if remeasured == spec.max_remeasure or (
            deadline is not None and time.time() + spec.repeats * per_pass > deadline
        ):
            break
        remeasured += 1  # more passes, continuing the rotation
        with ForeignLoad() as load:
            more = interleaved(steps, spec.repeats, warmup=0, start=spec.warmup + remeasured * spec.repeats)
        if beside_other_work:  # those passes read slow: these replace them
            runs, foreign = more, load.cores
        else:  # noisy: these add to them
            runs = {c: runs[c] + more[c] for c in chunks}
            foreign = None if foreign is None or load.cores is None else max(foreign, load.cores)
    finished = datetime.now(UTC)
    memory = {c: engine.prefill_memory(workload, FixedPolicy(c)) for c in chunks}  # untimed, after the clock

    request_row = engine.request(n, attention).row(hardware)
    flops = float(prefill_flops(request_row)[0])
    base = {
        "config_key": config.key,
        "spec_name": spec.name,
        "model": config.model,
        "family": engine.shape.family,
        **hardware,
        **request_row,
        "compiled": engine.config.compile,
        "matmul_peak_gflops": matmul_peak(config.dtype, config.threads, pool.device),
        "allocator": engine.runtime.allocator,
        "backend_version": engine.backend_version,
        "noisy": cv > spec.cv_threshold,
        "remeasured": remeasured,
        "foreign_cores": foreign,
        "started_at": started,
        "finished_at": finished,
        "harness_version": HARNESS_VERSION,
    }
    rows = []
    for c in chunks:
        results = runs[c]
        ttft = [r.ttft_ms for r in results]
        iqr, cv_c = spread(ttft)
        rows.append(
            {
                **base,
                "chunk_size": c,
                "is_full": c == n,
                "num_chunks": chunk_count(n, c),
                "last_chunk": last_chunk(n, c),
                "tokenize_ms": statistics.median(r.tokenize_ms for r in results),
                "prefill_ms": (prefill_ms := statistics.median(r.prefill_ms for r in results)),
                "prefill_gflops": flops / 1e9 / (prefill_ms / 1e3),
                "first_decode_ms": statistics.median(r.first_decode_ms for r in results),
                "ttft_ms": statistics.median(ttft),
                "ttft_iqr_ms": iqr,
                "ttft_cv": cv_c,
                "repeats": len(ttft),
                "ttft_repeats_ms": ttft,
                "prefill_repeats_ms": [r.prefill_ms for r in results],
                # chunk i runs after i * c tokens of history: per-chunk medians train a cost per chunk
                # (none where the backend shows no chunks)
                "chunk_ms": [statistics.median(times) for times in zip(*(r.chunk_ms for r in results), strict=True)]
                or None,
                "n_batch": engine.batch_tokens(c),
                "n_ubatch": engine.batch_tokens(c),
                "kv_cache_bytes": results[0].kv_cache_bytes,
                "peak_memory_bytes": max(r.peak_memory_bytes for r in results),
                "prefill_memory_bytes": memory[c],
            }
        )
    return pd.DataFrame(rows)
