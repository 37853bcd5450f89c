"""Measuring one config in a worker: every feasible chunk size, interleaved over repeats after a
warm-up, re-measured while noisy; one row per chunk size."""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone

import pandas as pd

from engine.engine import Engine, EngineConfig, Prompt, TTFTResult
from engine.policy import FixedPolicy
from engine import runtime

from .spec import ProfileConfig, Spec
from .store import HARNESS_VERSION


class EnginePool:
    """Engines by (model, dtype, attn_impl), the last few kept: loading a model costs seconds."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.engines: dict[tuple, Engine] = {}

    def get(self, config: ProfileConfig) -> Engine:
        key = (config.model, config.dtype, config.attn_impl)
        if key not in self.engines:
            while len(self.engines) >= self.keep:
                self.engines.pop(next(iter(self.engines)))
            self.engines[key] = Engine(EngineConfig(config.model, config.dtype, config.threads, config.attn_impl))
        runtime.configure(config.threads)
        self.engines[key] = self.engines.pop(key)  # most recently used last
        return self.engines[key]


def _spread(values: list[float]) -> tuple[float, float]:
    """(IQR, coefficient of variation) of repeated timings."""
    if len(values) < 2:
        return 0.0, 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1, statistics.pstdev(values) / statistics.fmean(values)


def measure_config(pool: EnginePool, config: ProfileConfig, spec: Spec, hardware: dict) -> pd.DataFrame:
    engine = pool.get(config)
    chunks, _ = config.candidates(spec.chunk_sizes)
    n, attention = config.context_length, config.attention
    text = engine.prompt_text(Prompt(num_tokens=n))
    runs: dict[int, list[TTFTResult]] = {c: [] for c in chunks}
    started = datetime.now(timezone.utc)

    def one_pass(rotation: int, keep: bool) -> None:
        # rotate the order each pass so that drift and cache state hit every candidate alike
        for c in chunks[rotation % len(chunks):] + chunks[: rotation % len(chunks)]:
            result = engine.run(text, n, attention, FixedPolicy(c))
            if keep:
                runs[c].append(result)

    for w in range(spec.warmup):
        one_pass(w, keep=False)
    remeasured, passes = 0, 0
    while True:
        for _ in range(spec.repeats):
            one_pass(passes, keep=True)
            passes += 1
        cv = statistics.median(_spread([r.ttft_ms for r in runs[c]])[1] for c in chunks)
        if cv <= spec.cv_threshold or remeasured >= spec.max_remeasure:
            break
        remeasured += 1
    finished = datetime.now(timezone.utc)

    shape = engine.shape
    base = {
        "config_key": config.key, "spec_name": spec.name, "model": config.model, "family": shape.family,
        "num_layers": shape.num_layers, "hidden_size": shape.hidden_size, "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size, "global_every": shape.global_every or 0, "parameters": engine.loaded.parameters,
        "context_length": n, "window": config.window or 0, "layout": config.layout, "sinks": config.sinks,
        "dtype": config.dtype, "threads": config.threads, "attn_impl": config.attn_impl,
        **hardware, "allocator": engine.runtime.allocator,
        "noisy": cv > spec.cv_threshold, "remeasured": remeasured,
        "started_at": started, "finished_at": finished, "harness_version": HARNESS_VERSION,
    }
    rows = []
    for c in chunks:
        results = runs[c]
        ttft = [r.ttft_ms for r in results]
        iqr, cv_c = _spread(ttft)
        num_chunks = math.ceil(n / c)
        rows.append({
            **base,
            "chunk_size": c, "is_full": c == n, "num_chunks": num_chunks, "last_chunk": n - (num_chunks - 1) * c,
            "tokenize_ms": statistics.median(r.tokenize_ms for r in results),
            "prefill_ms": statistics.median(r.prefill_ms for r in results),
            "first_decode_ms": statistics.median(r.first_decode_ms for r in results),
            "ttft_ms": statistics.median(ttft), "ttft_iqr_ms": iqr, "ttft_cv": cv_c, "repeats": len(ttft),
            "ttft_repeats_ms": ttft, "prefill_repeats_ms": [r.prefill_ms for r in results],
            # chunk i runs after i * c tokens of history: per-chunk medians train a cost per chunk
            "chunk_ms": [statistics.median(times) for times in zip(*(r.chunk_ms for r in results))],
            "kv_cache_bytes": results[0].kv_cache_bytes,
            "peak_memory_bytes": max(r.peak_memory_bytes for r in results),
        })
    return pd.DataFrame(rows)
