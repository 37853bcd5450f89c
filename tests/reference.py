"""The reference the engine is checked against: ONE plain forward of the whole sequence through
transformers' own sdpa/eager kernels, with a mask built here from first principles (tril/triu),
independently of engine/attention.py."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from chunkpilot.contract import ModelShape


def reference_mask(
    n: int, window: int | None, sinks: int, dtype: torch.dtype, global_positions: tuple[int, ...] = ()
) -> torch.Tensor:
    """[1, 1, n, n] additive mask: row i may see column j iff j <= i and (i - j < window or j < sinks
    or j is a global token)."""
    ones = torch.ones(n, n, dtype=torch.bool)
    allowed = torch.tril(ones)
    if window is not None:
        band = torch.triu(allowed, diagonal=-(window - 1))  # drop j <= i - window
        always = torch.zeros(n, n, dtype=torch.bool)
        always[:, :sinks] = True
        always[:, [j for j in global_positions if j < n]] = True
        allowed = band | (allowed & always)
    mask = torch.zeros(n, n, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[None, None]


@contextmanager
def attn_implementation(model, name: str):
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@torch.inference_mode()
def reference_logits(
    model,
    shape: ModelShape,
    ids: torch.Tensor,
    window: int | None,
    sinks: int,
    kernel: str,
    global_positions: tuple[int, ...] = (),
) -> torch.Tensor:
    """Logits [N, V] of one forward over `ids` [1, N]; windows (and global tokens) only on the
    shape's local layers."""
    n = ids.shape[1]
    local = reference_mask(n, window, sinks, model.dtype, global_positions)
    if shape.global_every is not None:  # interleaved: global layers stay fully causal
        mask = {"sliding_attention": local, "full_attention": reference_mask(n, None, 0, model.dtype)}
    else:
        mask = local
    with attn_implementation(model, kernel):
        out = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(n)[None], use_cache=False)
    return out.logits[0].float()
