"""Masks built from token positions, and the attention function that applies them.

The function is registered with transformers' `AttentionInterface` and wraps transformers' own
sdpa and eager kernels: the model's q/k/v projections, RoPE and kernels stay untouched, only the
mask comes from here. Masks are built from the positions each cache layer reports, because the
model's own mask builder assumes keys sit in position order, which the ring layout breaks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTN_NAME = "chunkpilot"


def visible(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None, sinks: int, key_global: torch.Tensor
) -> torch.Tensor:
    """[Q, K] bool: causal, and within the window (q - k < window) or a sink (k < sinks); a key from
    the global store (`key_global` [K]) instead only outside the window, where its window copy is
    gone or hidden, so that no query sees a token twice."""
    q, k = query_pos[:, None], key_pos[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= ((q - k < window) | (k < sinks)) != key_global[None, :]
    return allowed


@dataclass
class StepMasks:
    """The masks of one forward (a prefill chunk or a decode step), built once per layer kind."""

    query_positions: torch.Tensor  # [Q]
    layers: list  # the cache's layers, read after each layer's update
    attn_impl: str
    dtype: torch.dtype
    _built: dict[type, torch.Tensor | None] = field(default_factory=dict)

    def for_layer(self, layer_idx: int) -> torch.Tensor | None:
        layer = self.layers[layer_idx]
        kind = type(layer)  # layers of one kind share window, sinks and key positions
        if kind not in self._built:
            self._built[kind] = self._build(layer)
        return self._built[kind]

    def _build(self, layer) -> torch.Tensor | None:
        q, k = self.query_positions, layer.key_positions
        no_history = k.shape[0] == q.shape[0]  # keys are always the chunk plus whatever history is kept
        if self.attn_impl == "sdpa" and no_history and (layer.window is None or q.shape[0] <= layer.window):
            return None  # plain causal: sdpa's is_causal path is about 2x faster than any mask
        allowed = visible(q, k, layer.window, layer.sinks.size, layer.key_global)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=q.device)
        # additive float mask: what eager expects, and faster than a bool mask in sdpa on CPU
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)[None, None]  # [1, 1, Q, K]


def chunk_attention(module, query, key, value, attention_mask, *, chunk_step: StepMasks, **kwargs):
    """Registered as `chunkpilot`: the step's mask, then transformers' sdpa or the model's eager."""
    mask = chunk_step.for_layer(module.layer_idx)
    if chunk_step.attn_impl == "sdpa":
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
    # each modeling file defines its own eager function (Gemma's adds soft-capping): use the model's
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, mask, **kwargs)


AttentionInterface.register(ATTN_NAME, chunk_attention)
