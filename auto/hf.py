"""`auto` for stock transformers users: the chunk size ChunkPilot would choose, for a model's own
`generate(..., prefill_chunk_size=...)`, decided from stock generate's own costs (the
`transformers` backend's rows). The model's config becomes the shared request (its shape, its own
sliding window in transformers' shift layout), this machine's descriptors come from the
engine's cache, and the answer comes from the service over HTTP or the champion in-process, with
the engine's fallback to the anchor (and its reason) when neither can answer."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from auto.client import AutoPolicy, InProcessPolicy, auto_at
from chunkpilot.contract import ChunkRequest, Decision
from engine.backends import own_attention
from engine.hardware import local_hardware, this_machine
from engine.models import DTYPES, shape_of
from engine.policy import DECISION_TIMEOUT_S, ChunkPolicy


def dtype_name(model: PreTrainedModel) -> str:
    return next((name for name, dtype in DTYPES.items() if dtype == model.dtype), "float32")


def auto_policy(
    model: PreTrainedModel, predictor: str, timeout_s: float = DECISION_TIMEOUT_S
) -> AutoPolicy | InProcessPolicy:
    """`predictor`: the service's URL (http://...) or an MLflow tracking URI to load the champion from."""
    hardware = local_hardware(dtype_name(model), torch.get_num_threads(), model.device.type)
    return auto_at(hardware, predictor, timeout_s)


def chunk_request(model: PreTrainedModel, context_length: int, memory_budget_mb: float | None = None) -> ChunkRequest:
    """What a policy decides on for a prompt of `context_length` tokens on `model` (within
    `memory_budget_mb` above the loaded model, if given)."""
    attn_impl = "eager" if model.config._attn_implementation == "eager" else "masked"
    return ChunkRequest(
        context_length=context_length,
        model=shape_of(model.config),
        attention=own_attention(model.config),
        dtype=dtype_name(model),
        threads=torch.get_num_threads(),
        attn_impl=attn_impl,
        backend="transformers",
        memory_budget_mb=memory_budget_mb,
        hardware=this_machine(model.device.type),
    )


def prefill_chunk_size(
    model: PreTrainedModel, context_length: int, policy: ChunkPolicy, memory_budget_mb: float | None = None
) -> Decision:
    """The decision for a prompt of `context_length` tokens on `model` (as `auto` makes it in the engine)."""
    return policy.decide(chunk_request(model, context_length, memory_budget_mb))


def chunked_generate(
    model: PreTrainedModel,
    inputs: dict[str, torch.Tensor],
    policy: ChunkPolicy,
    memory_budget_mb: float | None = None,
    **generate_kwargs: Any,
) -> tuple[torch.Tensor, Decision]:
    """`model.generate(**inputs, prefill_chunk_size=<the decision>, **generate_kwargs)` and the
    decision (the fastest size predicted to fit `memory_budget_mb`, if given)."""
    decision = prefill_chunk_size(model, int(inputs["input_ids"].shape[-1]), policy, memory_budget_mb)
    output = model.generate(**inputs, prefill_chunk_size=decision.chunk_size, **generate_kwargs)
    return output, decision
