"""A prefill's peak memory above the loaded model: the most bytes PyTorch's allocator held for the
prefill's tensors at once (activations, attention scores, the KV cache, the logits), above what it
held before. On a GPU, torch.cuda's own peak. A CPU allocator keeps no such count, so the profiler
records every allocation and free it makes during one untimed prefill and the peak of their running
sum is read: the same quantity, exact to the byte and the same in every process (what a memory model
can be fitted on; a process's resident set is not: glibc's arenas, pages and trims move it by tens
of MiB between runs of one size).

What it leaves out: memory held outside PyTorch's allocator (glibc's arena slack, and a native
library's own buffers: oneDNN's repacked bf16 weights on CPUs with AMX). `resident_peak_above`
reads the process's resident set instead; tests/test_memory.py checks one against the other in a
fresh process.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

from . import runtime

M_MMAP_THRESHOLD = -3  # glibc mallopt parameters (malloc.h)
MMAP_BLOCK = 64 * 1024  # glibc's own default threshold is 128 KiB, raised as big blocks are freed


def peak_above(step: Callable[[], object], device: torch.device) -> int:
    """Bytes `step` (one prefill) added at its peak to what PyTorch's allocator held before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    recorder = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_log_muted():  # kineto prints a line at each start and stop
        recorder.start()
    try:
        step()
    finally:
        with _native_log_muted():
            recorder.stop()
    events = [e for e in recorder.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):  # + an allocation, - a free
        held += event.nbytes()
        peak = max(peak, held)
    return peak


@contextmanager
def _native_log_muted() -> Iterator[None]:
    """File descriptor 2 points at /dev/null for the duration (a native library's log lines)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def resident_peak_above(step: Callable[[], object], device: torch.device) -> int:
    """Bytes `step` added at its peak to the process's resident set (Linux; 0 elsewhere): glibc maps
    big blocks and returns them at free for the duration, the heap is trimmed first and the peak
    reset (/proc/self/clear_refs). The cross-check of `peak_above` (tests/test_memory.py)."""
    libc = _libc()
    if libc is None:
        return 0
    libc.mallopt(runtime.M_MMAP_MAX, 1 << 16)
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_BLOCK)
    try:
        gc.collect()
        libc.malloc_trim(0)  # what earlier prefills left in the heap goes back to the system
        before = runtime.status_bytes("VmRSS:")
        runtime.reset_peak_memory(device)
        step()
        return max(0, runtime.peak_memory_bytes(device) - before)
    finally:  # the timing set-up again: the heap kept resident
        libc.mallopt(runtime.M_MMAP_MAX, 0)
        libc.mallopt(runtime.M_TRIM_THRESHOLD, runtime.TRIM_THRESHOLD)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None
