"""Process set-up that makes timings reproducible: allocator, threads, and memory readings.

glibc hands freed memory back to the system and maps big blocks afresh; PyTorch CPU then pays page
faults that vary from process to process (the notes saw one-shot 8192-token prefills at 4.2 s in one
process and 7.7 s in the next). Telling glibc to keep what it has fixes most of that drift.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import asdict, dataclass

import torch
import transformers

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # the largest int mallopt takes: in effect, never trim the heap


@dataclass(frozen=True)
class RuntimeInfo:
    """Recorded with every result, so a timing can be traced to the set-up that produced it."""

    device: str
    threads: int
    allocator: str
    torch_version: str
    transformers_version: str
    python_version: str

    def to_dict(self) -> dict:
        return asdict(self)


_configured: RuntimeInfo | None = None


def _pin_glibc_heap() -> str:
    if os.environ.get("CHUNKPILOT_MALLOC") == "default":  # for measuring what the set-up buys
        return "glibc defaults (CHUNKPILOT_MALLOC=default)"
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return "system default (not glibc)"
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return f"glibc mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD={TRIM_THRESHOLD})" if ok else "glibc (mallopt refused)"


def configure(threads: int | None = None, device: str = "cpu") -> RuntimeInfo:
    """Set allocator and threads once per process; later calls must agree on the thread count."""
    global _configured
    threads = threads or os.cpu_count() or 1
    if _configured is not None:
        if _configured.threads != threads:
            torch.set_num_threads(threads)
            _configured = RuntimeInfo(**{**_configured.to_dict(), "threads": threads})
        return _configured
    allocator = _pin_glibc_heap()
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)  # prefill has no inter-op parallelism worth a second pool
    except RuntimeError:  # already set, or parallel work already ran in this process
        pass
    _configured = RuntimeInfo(
        device=device,
        threads=threads,
        allocator=allocator,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        python_version=platform.python_version(),
    )
    return _configured


def current() -> RuntimeInfo:
    """The set-up in force (after `configure`)."""
    if _configured is None:
        raise RuntimeError("engine.runtime.configure() has not run in this process")
    return _configured


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so a clock read means what it says."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # Linux: "5" resets the process's peak resident set (VmHWM)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_memory_bytes(device: torch.device) -> int:
    """GPU: peak allocated since the last reset. CPU: peak resident set of the process since then."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return status_bytes("VmHWM:")


def status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS:, VmHWM:), bytes; 0 where the OS does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
