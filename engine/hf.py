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

from chunkpilot.contract import RequestFeatures

from .backends import own_attention
from .hardware import local_hardware
from .models import DTYPES, shape_of
from .policy import DECISION_TIMEOUT_S, ChunkPolicy, Decision
from .predictor_client import AutoPolicy, InProcessPolicy, auto_at


def dtype_name(model: PreTrainedModel) -> str:
    return next((name for name, dtype in DTYPES.items() if dtype == model.dtype), "float32")


def auto_policy(
    model: PreTrainedModel, predictor: str, timeout_s: float = DECISION_TIMEOUT_S
) -> AutoPolicy | InProcessPolicy:
    """`predictor`: the service's URL (http://...) or an MLflow tracking URI to load the champion from."""
    hardware = local_hardware(dtype_name(model), torch.get_num_threads(), model.device.type)
    return auto_at(hardware, predictor, timeout_s)


def request_features(model: PreTrainedModel, context_length: int) -> RequestFeatures:
    """What a policy decides on for a prompt of `context_length` tokens on `model`."""
    attn_impl = "eager" if model.config._attn_implementation == "eager" else "masked"
    return RequestFeatures(
        context_length,
        shape_of(model.config),
        own_attention(model.config),
        dtype_name(model),
        torch.get_num_threads(),
        attn_impl,
        "transformers",
    )


def prefill_chunk_size(model: PreTrainedModel, context_length: int, policy: ChunkPolicy) -> Decision:
    """The decision for a prompt of `context_length` tokens on `model` (as `auto` makes it in the engine)."""
    return policy.decide(request_features(model, context_length))


def chunked_generate(
    model: PreTrainedModel, inputs: dict[str, torch.Tensor], policy: ChunkPolicy, **generate_kwargs: Any
) -> tuple[torch.Tensor, Decision]:
    """`model.generate(**inputs, prefill_chunk_size=<the decision>, **generate_kwargs)` and the decision."""
    decision = prefill_chunk_size(model, int(inputs["input_ids"].shape[-1]), policy)
    output = model.generate(**inputs, prefill_chunk_size=decision.chunk_size, **generate_kwargs)
    return output, decision
