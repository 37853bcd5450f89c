"""A prefill's peak memory above the loaded model, measured on a CPU that has no device allocator.

The timing set-up keeps glibc's heap resident (engine.runtime: no mmap, no trim), so the process's
peak resident set never falls and every size of a config reads the same high-water mark. A memory
pass therefore lets glibc map each block of MMAP_BLOCK or more on its own (handed back to the system
when freed), trims the heap, reads the resident set, resets the peak (Linux: /proc/self/clear_refs)
and runs one untimed prefill: its peak resident set less the one before is what the prefill added
(activations, attention scores, the KV cache, the logits). The timing set-up is restored after.
tests/test_memory.py checks it against a fresh process per size. On a GPU: torch's allocator peak
above what was allocated before.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from . import runtime

M_MMAP_THRESHOLD = -3  # glibc mallopt parameters (malloc.h)
MMAP_BLOCK = 64 * 1024  # glibc's own default threshold is 128 KiB, raised as big blocks are freed


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def resident_bytes() -> int:
    """The process's resident set now (Linux; 0 elsewhere)."""
    return runtime.status_bytes("VmRSS:")


@contextmanager
def unpinned_heap() -> Iterator[None]:
    """glibc maps big blocks and returns them at free for the duration; the timing set-up after."""
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(runtime.M_MMAP_MAX, 1 << 16)
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_BLOCK)
    try:
        yield
    finally:
        libc.mallopt(runtime.M_MMAP_MAX, 0)
        libc.mallopt(runtime.M_TRIM_THRESHOLD, runtime.TRIM_THRESHOLD)


def peak_above(step: Callable[[], object], device: torch.device) -> int:
    """Bytes `step` (one prefill) added at its peak to what the process held before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    with unpinned_heap():
        gc.collect()
        if (libc := _libc()) is not None:
            libc.malloc_trim(0)  # what earlier prefills left in the heap goes back to the system
        before = resident_bytes()
        runtime.reset_peak_memory(device)
        step()
        return max(0, runtime.peak_memory_bytes(device) - before)
