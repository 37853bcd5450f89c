"""KV layouts for chunked prefill: full, shift window, ring window; attention sinks and global
tokens on both windows.

Every layer records the absolute positions of the keys its last `update` returned
(`key_positions`) and which of them are global copies (`key_global`), so one mask rule
(engine/attention.py) serves every layout, including the ring, whose slots are not in position order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from chunkpilot.contract import AttentionConfig


class Sinks:
    """The first `size` tokens, kept aside so that every query sees them (StreamingLLM)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.count = 0
        self.keys: torch.Tensor | None = None  # [B, H, count, D]
        self.values: torch.Tensor | None = None

    def take(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the chunk's tokens that are sinks; return the rest."""
        n = min(max(self.size - self.count, 0), keys.shape[-2])
        if n:  # copies: a view would keep the whole first chunk's keys and values alive
            head_k, head_v = keys[..., :n, :].clone(), values[..., :n, :].clone()
            self.keys = head_k if self.keys is None else torch.cat([self.keys, head_k], dim=-2)
            self.values = head_v if self.values is None else torch.cat([self.values, head_v], dim=-2)
            self.count += n
        return keys[..., n:, :], values[..., n:, :]

    def prepend(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.count:
            return keys, values, positions
        sink_positions = torch.arange(self.count, device=positions.device)
        return (
            torch.cat([self.keys, keys], dim=-2),
            torch.cat([self.values, values], dim=-2),
            torch.cat([sink_positions, positions]),
        )

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class Globals:
    """Tokens at chosen positions (a question marker, say), kept aside in a store of at most `cap`
    tokens so that every later query sees them besides the window. They stay in the window too: the
    mask shows the copy here only once the window has moved past it (engine/attention.py)."""

    def __init__(self, positions: torch.Tensor) -> None:
        self.positions = positions  # [G] sorted, none of them a sink
        self.keys: torch.Tensor | None = None  # [B, H, count, D]
        self.values: torch.Tensor | None = None
        self.kept = positions[:0]  # the positions stored so far

    def copy(self, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
        """Store the chunk's global tokens; the chunk holds positions start.. ."""
        if not len(self.positions):  # no global tokens: skip the search (two host syncs on a GPU)
            return
        n = keys.shape[-2]
        lo, hi = (int(i) for i in torch.searchsorted(self.positions, torch.tensor([start, start + n])))
        if lo == hi:
            return
        at = self.positions[lo:hi] - start
        head_k, head_v = keys.index_select(-2, at), values.index_select(-2, at)
        self.keys = head_k if self.keys is None else torch.cat([self.keys, head_k], dim=-2)
        self.values = head_v if self.values is None else torch.cat([self.values, head_v], dim=-2)
        self.kept = self.positions[:hi]

    def prepend(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys, values, positions, which are global copies) with the store in front."""
        if self.keys is None:
            return keys, values, positions, torch.zeros_like(positions, dtype=torch.bool)
        is_global = torch.cat(
            [torch.ones_like(self.kept, dtype=torch.bool), torch.zeros_like(positions, dtype=torch.bool)]
        )
        return (
            torch.cat([self.keys, keys], dim=-2),
            torch.cat([self.values, values], dim=-2),
            torch.cat([self.kept, positions]),
            is_global,
        )

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


NO_GLOBALS = torch.zeros(0, dtype=torch.long)


class Buffer:
    """Keys and values [B, H, slots, D] written in place; the last `keep` tokens of what is stored
    stay in it. Appending the chunk writes it after them; when the slots run out, the kept tokens
    move to the front (one copy of `keep` tokens), or the buffer doubles if that leaves too little
    room. So a key is copied once when written and moved rarely, where a concatenating cache copies
    its whole history again at every chunk (O(N^2 / c) bytes per prefill without a window)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: int) -> None:
        batch, heads, _, dim = keys.shape
        self.keys = keys.new_empty(batch, heads, slots, dim)  # [B, H, slots, D]
        self.values = values.new_empty(batch, heads, slots, values.shape[-1])
        self.start = self.end = 0  # the stored tokens are slots start..end-1

    def append(self, keys: torch.Tensor, values: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the chunk after the last `keep` stored tokens -> (those and the chunk, as views)."""
        n, slots = keys.shape[-2], self.keys.shape[-2]
        keep = min(keep, self.end - self.start)
        if self.end + n > slots:
            kept = slice(self.end - keep, self.end)
            old_keys, old_values = self.keys, self.values
            if keep + n > slots // 2:  # moving would leave too little room before the next move
                grown = max(2 * slots, keep + n)
                self.keys = old_keys.new_empty(*old_keys.shape[:2], grown, old_keys.shape[-1])
                self.values = old_values.new_empty(*old_values.shape[:2], grown, old_values.shape[-1])
            # clone: a move to the front may overlap its source
            self.keys[:, :, :keep] = old_keys[:, :, kept].clone()
            self.values[:, :, :keep] = old_values[:, :, kept].clone()
            self.start, self.end = 0, keep
        self.keys[:, :, self.end : self.end + n] = keys
        self.values[:, :, self.end : self.end + n] = values
        self.end += n
        self.start = max(self.start, self.end - keep - n)
        return self.keys[:, :, self.start : self.end], self.values[:, :, self.start : self.end]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class FullLayer(CacheLayerMixin):
    """Every key at its position 0..n-1, in one buffer sized from `capacity` (the prompt and its
    first decode step, where the cache is told them), so that a prefill allocates once."""

    is_sliding = False
    window: int | None = None

    def __init__(self, capacity: int = 0) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.sinks, self.globals = Sinks(0), Globals(NO_GLOBALS)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.buffer = Buffer(key_states, value_states, max(self.capacity, key_states.shape[-2]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.buffer.append(key_states, value_states, keep=self.length)
        self.length += key_states.shape[-2]
        self.key_positions = torch.arange(self.length, device=key_states.device)
        self.key_global = torch.zeros_like(self.key_positions, dtype=torch.bool)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1  # grows with the context

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes if self.is_initialized else 0


class ShiftLayer(CacheLayerMixin):
    """The shift layout (transformers' `DynamicSlidingWindowLayer`): the last window-1 tokens plus the
    chunk, so any chunk size fits; here in a buffer of twice that, written in place (transformers'
    concatenates the window and the chunk at every step). Sinks: tokens before `sinks` go to the
    sink store, the rest through the window; global tokens are copied to their store on the way."""

    is_sliding = True

    def __init__(self, window: int, sinks: int, globals_: torch.Tensor, capacity: int = 0) -> None:
        super().__init__()
        self.window, self.capacity = window, capacity
        self.sinks, self.globals = Sinks(sinks), Globals(globals_)
        self.cumulative_length = 0  # tokens that went through the window

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        slots = 2 * (self.window - 1 + key_states.shape[-2])
        self.buffer = Buffer(key_states, value_states, min(slots, self.capacity) if self.capacity else slots)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.globals.copy(key_states, value_states, self.get_seq_length())
        if not self.is_initialized:  # sized for a whole chunk, sinks included: sized without them,
            self.lazy_initialization(key_states, value_states)  # the next full chunk would double it
        key_states, value_states = self.sinks.take(key_states, value_states)
        keys, values = self.buffer.append(key_states, value_states, keep=self.window - 1)
        self.keys, self.values = keys, values
        self.cumulative_length += key_states.shape[-2]
        end = self.sinks.size + self.cumulative_length  # window tokens sit at positions >= sinks.size
        positions = torch.arange(end - keys.shape[-2], end, device=keys.device)
        keys, values, positions = self.sinks.prepend(keys, values, positions)
        keys, values, self.key_positions, self.key_global = self.globals.prepend(keys, values, positions)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return len(self.globals.kept) + self.sinks.count + min(
            self.cumulative_length, self.window - 1
        ) + query_length, 0

    def get_seq_length(self) -> int:
        return self.sinks.count + self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes if self.is_initialized else 0


class RingLayer(CacheLayerMixin):
    """ExecuTorch's ring: 2*window slots allocated once and written at (position - sinks) % slots, so
    memory does not grow with the context. Two windows of slots let a chunk of up to `window` tokens
    be written before it attends without overwriting keys its first query still needs.
    transformers has no ring (its static sliding layer rolls the whole buffer), hence our own."""

    is_sliding = True

    def __init__(self, window: int, sinks: int, globals_: torch.Tensor) -> None:
        super().__init__()
        self.window = window
        self.slots = 2 * window
        self.sinks, self.globals = Sinks(sinks), Globals(globals_)
        self.written = 0  # window tokens written so far

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.keys = key_states.new_zeros(batch, heads, self.slots, dim)  # [B, H, slots, D]
        self.values = value_states.new_zeros(batch, heads, self.slots, value_states.shape[-1])
        self.slot_positions = torch.full((self.slots,), -1, dtype=torch.long, device=key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.globals.copy(key_states, value_states, self.get_seq_length())
        key_states, value_states = self.sinks.take(key_states, value_states)
        n = key_states.shape[-2]
        if n > self.window:
            raise ValueError(f"ring layout takes at most window={self.window} tokens per step, got {n}")
        ordinals = torch.arange(self.written, self.written + n, device=key_states.device)
        slots = ordinals % self.slots
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        self.slot_positions[slots] = ordinals + self.sinks.size
        self.written += n
        filled = min(self.written, self.slots)  # slots fill in order, so the filled ones are a prefix
        keys, values, positions = self.sinks.prepend(
            self.keys[:, :, :filled], self.values[:, :, :filled], self.slot_positions[:filled]
        )
        keys, values, self.key_positions, self.key_global = self.globals.prepend(keys, values, positions)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return len(self.globals.kept) + self.sinks.count + min(self.written + query_length, self.slots), 0

    def get_seq_length(self) -> int:
        return self.sinks.count + self.written

    def get_max_length(self) -> int:
        return len(self.globals.positions) + self.sinks.size + self.slots

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes if self.is_initialized else 0


class ChunkCache(Cache):
    """One layer per model layer: windowed layers where the shape is local and a window is set.
    `global_positions`: tokens the windowed layers keep visible to every later query; `capacity`:
    the tokens the cache will see (prompt and decode steps), so that full layers allocate once and
    shift layers no more than that (0: unknown, buffers grow)."""

    def __init__(
        self,
        local_layers: tuple[bool, ...],
        attention: AttentionConfig,
        global_positions: Sequence[int] = (),
        capacity: int = 0,
    ) -> None:
        globals_ = torch.tensor(sorted({p for p in global_positions if p >= attention.sinks}), dtype=torch.long)

        def layer(local: bool) -> CacheLayerMixin:
            if not (local and attention.window):
                return FullLayer(capacity)
            if attention.layout == "ring":
                return RingLayer(attention.window, attention.sinks, globals_)
            return ShiftLayer(attention.window, attention.sinks, globals_, capacity)

        super().__init__(layers=[layer(local) for local in local_layers])

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache now (keys, values, sinks and global tokens of every layer)."""
        return sum(layer.nbytes + layer.sinks.nbytes + layer.globals.nbytes for layer in self.layers)
