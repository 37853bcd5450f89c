"""The attention function registered with transformers' `AttentionInterface`, in three kernels.

`split` (the default on a CPU) computes only what a query sees: the keys are cut into blocks that
are either wholly visible (no mask) or a causal triangle (`is_causal`, which the kernel skips
blocks of), each block attended with torch's CPU flash kernel, which also returns the log-sum-exp,
and the blocks merged by it (vLLM's `merge_attn_states`). A shift layer's chunk of at most half
the window is the exception: its keys are the window's last W-1 and itself, so one call with the
step's mask wastes at most a third of the scores and costs less than three calls and a merge.
`masked` and `eager` wrap transformers' own kernels (sdpa, the model's eager) with a dense mask
[1, 1, Q, K] built here from the positions each cache layer reports (the model's own mask builder
assumes keys sit in position order, which the ring layout breaks); a dense mask makes PyTorch's
CPU flash kernel compute every key, hidden or not. The model's q/k/v projections and RoPE stay
untouched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from chunkpilot.features import shift_in_one_call

from .kv_cache import RingLayer, ShiftLayer

ATTN_NAME = "chunkpilot"


def visible(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None, sinks: int, key_global: torch.Tensor
) -> torch.Tensor:
    """[Q, K] bool: causal, and within the window (q - k < window) or a sink (k < sinks); a key from
    the global store (`key_global` [K]) instead only outside the window, where its window copy is
    gone or hidden, so that no query sees a token twice."""
    q, k = query_pos[:, None], key_pos[None, :]
    allowed = k <= q  # [Q, K]
    if window is not None:
        # k against each query's [Q, 1] edge: a [Q, K] difference of positions would hold 8 bytes a
        # cell, the step's peak at a long chunk (72.7 vs 64.7 MiB at 1,024 tokens of a 2,048 window)
        near = k > q - window  # [Q, K]
        near |= k < sinks
        near ^= key_global[None, :]
        allowed &= near
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
        if self.attn_impl != "eager" and no_history and (layer.window is None or q.shape[0] <= layer.window):
            return None  # plain causal: the flash kernel's is_causal path is about 2x faster than any mask
        allowed = visible(q, k, layer.window, layer.sinks.size, layer.key_global)
        # additive float mask: what eager expects, and faster than a bool mask in sdpa on CPU
        mask = torch.full(allowed.shape, torch.finfo(self.dtype).min, dtype=self.dtype, device=q.device)
        return mask.masked_fill_(allowed, 0.0)[None, None]  # [1, 1, Q, K]


Block = tuple[torch.Tensor, torch.Tensor, slice]  # (out [B, H, q, D], lse [B, H, q], the queries it covers)


def _flash(query, key, value, causal: bool, scale: float, mask: torch.Tensor | None = None):
    """query [B, Hk*g, q, D], key/value [B, Hk, k, D] -> (out [B, H, q, D] fp32, lse [B, H, q] fp32).
    A block without a mask folds the g query heads of a key head into rows, so grouped keys are never
    copied; a causal or masked block is small (at most a chunk) and repeats them."""
    batch, heads, q_len, dim = query.shape
    groups = heads // key.shape[1]
    if groups > 1 and not causal and mask is None:
        folded = query.reshape(batch, key.shape[1], groups * q_len, dim)  # [B, Hk, g*q, D]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(folded, key, value, scale=scale)
        return out.reshape(batch, heads, q_len, -1).float(), lse.reshape(batch, heads, q_len).float()
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, causal, attn_mask=mask, scale=scale
    )
    return out.float(), lse.float()


def _merge(blocks: list[Block], shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Blocks over subsets of the queries -> their softmax over the union of keys [B, H, Q, D]."""
    if len(blocks) == 1 and range(shape[2])[blocks[0][2]] == range(shape[2]):  # one block, every query
        return blocks[0][0].to(dtype)
    lse = torch.full(shape[:3], float("-inf"))  # [B, H, Q]
    for _, block_lse, rows in blocks:
        lse[:, :, rows] = torch.logaddexp(lse[:, :, rows], block_lse)
    out = torch.zeros(*shape[:3], blocks[0][0].shape[-1])
    for block_out, block_lse, rows in blocks:
        out[:, :, rows] += block_out * (block_lse - lse[:, :, rows]).exp()[..., None]
    return out.to(dtype)


def split_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer, query_positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """query [B, H, Q, D] at positions s..s+Q-1; key/value [B, Hk, K, D] as the layer's update returned
    them: sinks and global copies first, then the window's keys (the ring's in slot order), which end
    with the chunk -> [B, H, Q, D]."""
    window, sinks = layer.window, layer.sinks.size
    positions, is_global = layer.key_positions, layer.key_global
    extra = int((is_global | (positions < sinks)).sum()) if window is not None else 0
    blocks: list[Block] = []
    if extra:  # sinks and global copies: a few keys, each with its own rule, so a small mask [Q, E]
        allowed = visible(query_positions, positions[:extra], window, sinks, is_global[:extra])
        if allowed.any():
            mask = torch.zeros(allowed.shape, dtype=query.dtype).masked_fill_(~allowed, float("-inf"))
            out, lse = _flash(query, key[:, :, :extra], value[:, :, :extra], False, scale, mask[None, None])
            blocks.append((out, lse.masked_fill(~allowed.any(-1), float("-inf")), slice(None)))
    keys, values, run = key[:, :, extra:], value[:, :, extra:], positions[extra:]
    if isinstance(layer, RingLayer):  # slots wrap: put the window's keys in position order
        order = run.argsort()
        keys, values, run = keys.index_select(2, order), values.index_select(2, order), run[order]
    if not run.numel():  # a chunk of sinks only
        return _merge(blocks, query.shape, query.dtype)
    first, end = int(run[0]), int(query_positions[-1]) + 1
    start = max(int(query_positions[0]), first)  # queries before the window's first key are sinks
    tile = end - start if window is None else min(end - start, window)
    offset = start - int(query_positions[0])
    for a in range(start, end, tile):  # query tiles [a, b): each sees keys in (a - window, b)
        b = min(a + tile, end)
        rows = slice(a - start + offset, b - start + offset)
        q = query[:, :, rows]
        at = lambda lo, hi: (keys[:, :, lo - first : hi - first], values[:, :, lo - first : hi - first])  # noqa: E731
        blocks.append((*_flash(q, *at(a, b), True, scale), rows))  # the tile's own keys: causal
        lo = first if window is None else max(b - window, first)
        if lo < a:  # keys every query of the tile sees
            blocks.append((*_flash(q, *at(lo, a), False, scale), rows))
        edge = max(a - window + 1, first) if window is not None else b
        if window is not None and edge < b - window:
            # keys in [a-W+1, b-W): query a+i sees those from a+i-W+1 on, an anti-causal triangle;
            # reversing queries (all but the tile's last, which sees none) and keys makes it causal
            k, v = at(edge, b - window)
            out, lse = _flash(q[:, :, :-1].flip(2), k.flip(2), v.flip(2), True, scale)
            blocks.append((out.flip(2), lse.flip(2), slice(rows.start, rows.stop - 1)))
    return _merge(blocks, query.shape, query.dtype)


def chunk_attention(module, query, key, value, attention_mask, *, chunk_step: StepMasks, **kwargs):
    """Registered as `chunkpilot`: the split kernel, or the step's mask then transformers' sdpa or
    the model's eager."""
    if chunk_step.attn_impl == "split":
        layer = chunk_step.layers[module.layer_idx]
        scale = kwargs.get("scaling") or module.scaling
        if isinstance(layer, ShiftLayer) and shift_in_one_call(query.shape[2], layer.window):
            mask = chunk_step.for_layer(module.layer_idx)  # None: plain causal
            out, _ = _flash(query, key, value, mask is None, scale, mask)
        else:
            out = split_attention(query, key, value, layer, chunk_step.query_positions, scale)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None  # [B, Q, H, D], as transformers' return
    mask = chunk_step.for_layer(module.layer_idx)
    if chunk_step.attn_impl == "masked":
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
    # each modeling file defines its own eager function (Gemma's adds soft-capping): use the model's
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, mask, **kwargs)


AttentionInterface.register(ATTN_NAME, chunk_attention)
