"""What the machine is: a static fingerprint with a stable `hardware_id`, read from the OS (a
GPU's from torch), without importing torch or transformers for a CPU, so that a process which only
names the machine (the profiler's parent, a bench) starts in a fraction of a second."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib.metadata import version
from pathlib import Path


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_bytes(level: int) -> int:
    """Largest cache of that level (Linux sysfs), or 0 when unknown."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if int((index / "level").read_text()) == level:
                text = (index / "size").read_text().strip()
                sizes.append(int(text[:-1]) * {"K": 1024, "M": 2**20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError):
            continue
    return max(sizes, default=0)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def available_memory_bytes() -> int:
    """What a prefill may take now: the kernel's MemAvailable, less where this process's cgroup
    (a container's limit) leaves less; 0 when the OS does not say."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, min(found, default=0))


def fingerprint(device: str = "cpu") -> dict:
    """What the machine is; `hardware_id` hashes only what does not change between runs."""
    if device.startswith("cuda"):
        import torch  # only a GPU's fingerprint needs it: a CPU's is read from the OS

        props = torch.cuda.get_device_properties(device)
        static = {
            "device_kind": "cuda",
            "device_name": props.name,
            "cores": props.multi_processor_count,
            "l2_cache_bytes": getattr(props, "L2_cache_size", 0),
            "l3_cache_bytes": 0,
            "memory_bytes": props.total_memory,
        }
    else:
        static = {
            "device_kind": "cpu",
            "device_name": _cpu_name(),
            "cores": len(os.sched_getaffinity(0)),  # the cores this process may use: a pinned container's, say
            "l2_cache_bytes": _cache_bytes(2),
            "l3_cache_bytes": _cache_bytes(3),
            "memory_bytes": _memory_bytes(),
        }
    stable = {k: v for k, v in static.items() if k != "memory_bytes"}
    ident = json.dumps({**stable, "memory_gib": round(static["memory_bytes"] / 2**30)}, sort_keys=True)
    return {
        "hardware_id": hashlib.sha1(ident.encode()).hexdigest()[:12],
        **static,
        "torch_version": version("torch"),
        "transformers_version": version("transformers"),
    }
