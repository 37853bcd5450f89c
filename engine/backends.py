"""The backends a prefill runs on, beside the bundled engine: stock transformers `generate()` and a
llama.cpp context. Each loads the same model (presets: the same seeded weights) and tokenizer as
the engine and replaces only the prefill and first token (Engine.to_first_token), so the profiler,
the comparison and `chunkpilot prefill` measure every backend through one harness.

- transformers: `model.generate(input_ids, prefill_chunk_size=c, max_new_tokens=1)` on the model's
  stock attention, timed to the first token; generate shows no chunk boundaries, so no per-chunk
  times. It runs the model's own attention only (its window in the shift layout, no sinks).
- llama.cpp: a `llama_cpp.Llama` context on the model's weights written to GGUF (engine.gguf_export,
  cached per model, seed and quantisation), once a probe in a child process has run that
  quantisation here (engine.llama_probe: a build the CPU refuses must not kill us); each chunk is
  one `llama_decode` of `c` tokens (one micro-batch: the context's n_ubatch is at least c), timed
  on its own, then the first decode step.
  Full attention only (llama.cpp's llama and qwen2 architectures have no sliding window)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from chunkpilot.contract import AttentionConfig, Backend, ChunkRequest, ConfigError

from .config import EngineConfig
from .engine import Engine, Prefilled, Prepared
from .gguf_export import FTYPES, Weights, supported, write_gguf
from .hardware import user_cache_dir
from .llama_lib import buffers_reported, build, llama_cpp
from .llama_probe import require
from .policy import ChunkPolicy
from .prefill import clock_ms
from .workload import Workload


def own_attention(model_config: Any) -> AttentionConfig:
    """The attention a stock transformers model runs: its config's sliding window, in the shift layout."""
    windowed = getattr(model_config, "use_sliding_window", True)
    window = getattr(model_config, "sliding_window", None) if windowed else None
    return AttentionConfig(window=window or None)


class TransformersEngine(Engine):
    backend: ClassVar[Backend] = "transformers"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        # stock attention, as a user has it: transformers' sdpa (masked) or its eager
        self.model.set_attn_implementation({"masked": "sdpa", "eager": "eager"}[config.attn_impl])

    @property
    def backend_version(self) -> str:
        import transformers

        return transformers.__version__

    def request(self, context_length: int, attention: AttentionConfig) -> ChunkRequest:
        own = own_attention(self.model.config)
        if attention != own:
            raise ConfigError(
                "attention", f"stock generate runs the model's own attention ({own.label}); got {attention.label}"
            )
        return super().request(context_length, attention)

    @torch.inference_mode()
    def to_first_token(self, prepared: Prepared, chunks: Sequence[int]) -> Prefilled:
        n, size = prepared.request.context_length, chunks[0]
        if any(c != size for c in chunks[:-1]) or chunks[-1] > size:
            raise ConfigError("schedule", "generate takes one prefill chunk size, not a schedule")
        ids = prepared.ids  # [1, N]
        t2 = clock_ms(self.device)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=1,
            do_sample=False,
            prefill_chunk_size=size if size < n else None,  # None: generate's own one shot
            return_dict_in_generate=True,
            output_scores=True,
        )
        t3 = clock_ms(self.device)
        cache = out.get("cache") or out.get("past_key_values")  # renamed during 5.x, like the forward's keyword
        kv = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)
        return Prefilled(int(out.sequences[0, -1]), out.scores[0][0].float(), [], t3 - t2, 0.0, kv)


def weights_of(model: Any) -> Weights:
    """A transformers model's tensors (float32, numpy) and the hyperparameters GGUF asks for."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    local = rope.get("sliding_attention", {}).get("rope_theta")  # Gemma 3: a base per layer type
    rope = rope.get("full_attention", rope)
    theta = rope.get("rope_theta") or getattr(config, "rope_theta", 10000.0)
    tensors = {name: t.detach().float().cpu().numpy() for name, t in model.state_dict().items()}
    return Weights(tensors, float(theta), float(config.rms_norm_eps), None if local is None else float(local))


class LlamaCppEngine(Engine):
    backend: ClassVar[Backend] = "llama.cpp"

    def __init__(self, config: EngineConfig) -> None:
        # before any native call here: refused, not killed
        self.features = require(FTYPES[config.quant], config.attn_impl == "flash")
        self._version = build()
        super().__init__(config)
        if (why := supported(self.shape)) is not None:
            raise ConfigError("model", f"llama.cpp cannot run {config.model}: {why}")
        if config.dtype != "float32":
            raise ConfigError(
                "dtype", f"the llama.cpp backend reads float32 weights to write its GGUF; got {config.dtype}"
            )
        digest = hashlib.sha1(f"{self.shape.model_dump_json()}|{config.seed}|{config.model}".encode()).hexdigest()
        self.gguf = user_cache_dir() / "gguf" / f"{Path(config.model).stem}-{digest[:10]}-{config.quant}.gguf"
        if not self.gguf.exists():
            write_gguf(weights_of(self.model), self.shape, self.gguf, config.quant)
        self._contexts: dict[tuple[int, int], Any] = {}
        self._buffers: dict[tuple[int, int], int] = {}  # each context's reported buffers, bytes
        self._used = (0, 0)  # the context the last prefill ran in

    @property
    def backend_version(self) -> str:
        return self._version

    def request(self, context_length: int, attention: AttentionConfig) -> ChunkRequest:
        if attention != (own := own_attention(self.model.config)):
            raise ConfigError(
                "attention",
                f"the llama.cpp backend runs the model's own attention ({own.label}); got {attention.label}",
            )
        return super().request(context_length, attention)

    def context(self, n_ctx: int, n_ubatch: int):
        """A llama.cpp context holding `n_ctx` positions, `n_ubatch` tokens per micro-batch; the
        last two kept (a context's buffers are sized by both)."""
        key = (n_ctx, n_ubatch)
        if key not in self._contexts:
            while len(self._contexts) >= 2:
                self._contexts.pop(next(iter(self._contexts))).close()
            threads = self.runtime.threads
            with buffers_reported() as sizes:
                self._contexts[key] = llama_cpp().Llama(
                    str(self.gguf),
                    n_ctx=n_ctx,
                    n_batch=n_ubatch,
                    n_ubatch=n_ubatch,
                    n_threads=threads,
                    n_threads_batch=threads,
                    flash_attn=self.config.attn_impl == "flash",
                    swa_full=False,  # llama-server's default: local layers keep window + n_ubatch cells
                    verbose=False,
                )
            self._buffers[key] = sum(sizes)
        self._used = key
        return self._contexts[key]

    def prefill_memory(self, workload: Workload, policy: ChunkPolicy) -> int:
        """llama.cpp's own account of what a prefill needs beside the weights: the KV, compute and
        output buffers it reports for the context (n_ctx, n_ubatch) the prefill runs in."""
        self.run(workload, policy)
        return self._buffers[self._used]

    def batch_tokens(self, chunk: int) -> int:
        return _padded(chunk)

    def to_first_token(self, prepared: Prepared, chunks: Sequence[int]) -> Prefilled:
        n = prepared.request.context_length
        llm = self.context(_padded(n + 1), self.batch_tokens(max(chunks)))
        tokens = prepared.ids[0].tolist()
        t2 = clock_ms(self.device)
        chunk_ms = decode_chunks(llm, tokens, chunks)
        # a view of llama.cpp's buffer, which the next decode overwrites: copied at once
        logits = np.ctypeslib.as_array(llama_cpp().llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
        first = int(logits.argmax())
        t3 = clock_ms(self.device)
        decode_chunks(llm, [first], [1], keep=True)
        t4 = clock_ms(self.device)
        kv = llama_cpp().llama_state_get_size(llm.ctx)
        return Prefilled(first, torch.from_numpy(logits), chunk_ms, t3 - t2, t4 - t3, int(kv))


def _padded(n: int) -> int:
    """Up to a multiple of 256: llama.cpp pads its KV cells so, and nearby lengths share a context."""
    return -(-n // 256) * 256


def decode_chunks(llm: Any, tokens: Sequence[int], chunks: Sequence[int], keep: bool = False) -> list[float]:
    """`tokens` through the context in `chunks`, one `llama_decode` each (only the last token's
    logits kept), after clearing its memory unless `keep`; each decode's ms."""
    lib = llama_cpp()
    if not keep:
        lib.llama_memory_clear(lib.llama_get_memory(llm.ctx), True)
    times, start = [], 0
    for size in chunks:
        part = (lib.llama_token * size)(*tokens[start : start + size])
        t0 = time.perf_counter()
        code = lib.llama_decode(llm.ctx, lib.llama_batch_get_one(part, size))
        times.append((time.perf_counter() - t0) * 1e3)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} for a chunk of {size} tokens at {start}")
        start += size
    return times


ENGINES: dict[Backend, type[Engine]] = {
    "chunkpilot": Engine,
    "transformers": TransformersEngine,
    "llama.cpp": LlamaCppEngine,
}


def open_engine(config: EngineConfig) -> Engine:
    """The engine of `config.backend`."""
    return ENGINES[config.backend](config)
