"""The prefill loop: the prompt through the model in chunks over a KV cache, then one decode step."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from chunkpilot.chunks import uniform

from .attention import StepMasks
from .kv_cache import ChunkCache
from .runtime import synchronize


def clock_ms(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter() * 1e3


@functools.cache
def cache_keyword(model_type: type) -> str:
    """The forward's name for the KV cache: transformers renamed `past_key_values` to `cache` during
    5.x, and an unknown keyword would vanish into `**kwargs`, silently dropping the history."""
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def forward_step(
    model: PreTrainedModel, cache: ChunkCache, ids: torch.Tensor, start: int, attn_impl: str
) -> torch.Tensor:
    """`ids` [1, C] at positions start..start+C-1 -> logits of the last position [1, V]."""
    positions = torch.arange(start, start + ids.shape[1], device=ids.device)  # [C]
    step = StepMasks(positions, cache.layers, attn_impl, model.dtype)
    out = model(
        input_ids=ids,
        position_ids=positions[None],
        use_cache=True,
        logits_to_keep=1,  # the prefill needs only the last position's logits
        chunk_step=step,
        **{cache_keyword(type(model)): cache},
    )
    return out.logits[:, -1]


def prefill(
    model: PreTrainedModel, cache: ChunkCache, ids: torch.Tensor, chunks: int | Sequence[int], attn_impl: str
) -> tuple[torch.Tensor, list[float]]:
    """The prompt `ids` [1, N] in chunks of one size, or of a schedule (sizes in order, summing to N)
    -> (logits of position N-1 [1, V], each chunk's ms)."""
    sizes = uniform(ids.shape[1], chunks) if isinstance(chunks, int) else chunks
    chunk_ms, start = [], 0
    for size in sizes:
        t0 = clock_ms(ids.device)
        logits = forward_step(model, cache, ids[:, start : start + size], start, attn_impl)
        chunk_ms.append(clock_ms(ids.device) - t0)
        start += size
    return logits, chunk_ms


def decode_one_token(
    model: PreTrainedModel, cache: ChunkCache, token: torch.Tensor, position: int, attn_impl: str
) -> torch.Tensor:
    """The first decode step: the first generated token [1] at `position` -> next logits [1, V]."""
    return forward_step(model, cache, token.view(1, 1), position, attn_impl)
