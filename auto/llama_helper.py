"""`auto` for llama.cpp users: a `llama_cpp.Llama` the user already has evaluates a prompt in the
chunk size ChunkPilot chose. The model's GGUF metadata becomes the shared request (its shape, full
attention, the context's batch threads), this machine's descriptors come from the engine's cache,
and the decision from the service or the champion in-process; llama.cpp's own default (n_ubatch
512, and the reason) answers a request that cannot be described, the anchor one neither answers.

A chunk is one micro-batch: llama.cpp splits each `llama_decode` at the context's `n_ubatch`, and
the binding's `eval` splits the prompt at `n_batch`, so a size above both is cut to the smaller.
A `memory_budget_mb` is passed on to the decision; llama.cpp sizes its compute buffer when a
context is created, by its `n_ubatch`, so the memory a decision predicts is what a context created
with `n_ubatch` = the chosen size holds (llama-server's `--ubatch-size`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from auto.client import AutoPolicy, InProcessPolicy, auto_at
from chunkpilot.contract import AttentionConfig, ChunkRequest, ConfigError, Decision, ModelShape
from engine.gguf_export import QUANT_OF
from engine.hardware import local_hardware, this_machine
from engine.llama_probe import require
from engine.policy import DECISION_TIMEOUT_S, ChunkPolicy
from judge.lineup import applied, backend_default

FAMILIES = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3"}  # GGUF architecture -> the contract's family


def _threads(llm: Any) -> int:
    return int(llm.context_params.n_threads_batch)


def _window(meta: dict, arch: str, layers: int) -> tuple[int | None, int | None]:
    """(the sliding window, every how many layers one is global) a GGUF's metadata states; Gemma 3's
    pattern defaults to five local layers to one global, as llama.cpp reads it."""
    window = int(meta.get(f"{arch}.attention.sliding_window", 0)) or None
    if window is None:
        return None, None
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list | tuple):  # one bool per layer: True where local
        globals_ = [i for i, local in enumerate(pattern) if not local]
        pattern = globals_[0] + 1 if globals_ else layers
    return window, int(pattern)


def chunk_request(llm: Any, context_length: int, memory_budget_mb: float | None = None) -> ChunkRequest:
    """What a policy decides on for a prompt of `context_length` tokens on `llm` (ConfigError, naming
    the field, when its metadata says something the contract cannot hold)."""
    meta = llm.metadata
    arch = meta.get("general.architecture", "")
    if arch not in FAMILIES:
        raise ConfigError("model", f"GGUF architecture {arch!r} is not one ChunkPilot models ({', '.join(FAMILIES)})")
    file_type = int(meta.get("general.file_type", 0))
    if file_type not in QUANT_OF:
        known = ", ".join(f"{quant} ({ftype})" for ftype, quant in QUANT_OF.items())
        raise ConfigError("quant", f"GGUF file type {file_type} is not one ChunkPilot models: {known}")
    heads = int(meta[f"{arch}.attention.head_count"])
    hidden = int(meta[f"{arch}.embedding_length"])
    layers = int(meta[f"{arch}.block_count"])
    window, every = _window(meta, arch, layers)
    shape = ModelShape(
        family=FAMILIES[arch],
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        vocab_size=int(llm.n_vocab()),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        max_position=int(meta.get(f"{arch}.context_length", llm.n_ctx())),
        window=window,
        global_every=every,
    )
    return ChunkRequest(
        context_length,
        shape,
        AttentionConfig(window),
        threads=_threads(llm),
        attn_impl="flash" if _flash(llm) else "masked",
        backend="llama.cpp",
        quant=QUANT_OF[file_type],
        memory_budget_mb=memory_budget_mb,
        hardware=this_machine(),
    )


def _flash(llm: Any) -> bool:
    """Flash attention enabled, or auto (llama.cpp enables it where its CPU backend supports it)."""
    return int(llm.context_params.flash_attn_type) != 0


def auto_policy(llm: Any, predictor: str, timeout_s: float = DECISION_TIMEOUT_S) -> AutoPolicy | InProcessPolicy:
    """`predictor`: the service's URL (http://...) or an MLflow tracking URI to load the champion from."""
    return auto_at(local_hardware("float32", _threads(llm)), predictor, timeout_s)


def largest_chunk(llm: Any) -> int:
    """The largest chunk one `eval` step runs as one micro-batch."""
    return min(int(llm.n_batch), int(llm.context_params.n_ubatch))


def prefill_chunk_size(
    llm: Any, context_length: int, policy: ChunkPolicy, memory_budget_mb: float | None = None
) -> Decision:
    """The decision for a prompt of `context_length` tokens on `llm`, cut to what one step holds."""
    try:
        decision = policy.decide(chunk_request(llm, context_length, memory_budget_mb))
    except ConfigError as exc:
        default = backend_default("llama.cpp")
        size = applied(default.spec, context_length, None, "shift")  # llama.cpp attends fully
        decision = Decision(
            chunk_size=size, source="fallback", reason=f"{exc.field}: {exc.message}; {default.name} answered"
        )
    return decision.model_copy(update={"chunk_size": min(decision.chunk_size, largest_chunk(llm))})


def chunked_eval(
    llm: Any, tokens: Sequence[int], policy: ChunkPolicy, memory_budget_mb: float | None = None
) -> Decision:
    """`llm.eval(tokens)` from an empty context in chunks of the decided size, and the decision; the
    Llama is left as its own `eval` leaves it (its tokens and last logits), ready to sample. Before
    the first eval of a quantisation in this process, a probe (engine.llama_probe) checks in a
    child process that llama.cpp runs it here: a ConfigError naming it, not a dead process."""
    require(int(llm.metadata.get("general.file_type", 0)), _flash(llm))
    decision = prefill_chunk_size(llm, len(tokens), policy, memory_budget_mb)
    own = llm.n_batch
    llm.n_batch = decision.chunk_size  # `eval` steps by n_batch; its batch buffer holds the larger `own`
    try:
        llm.reset()
        llm.eval(list(tokens))
    finally:
        llm.n_batch = own
    return decision
