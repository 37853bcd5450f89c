"""The machine a row was measured on: a static fingerprint with a stable `hardware_id`, plus
descriptors measured once and cached (matmul GFLOP/s at a dtype and thread count, memory
bandwidth, the per-call overhead of a tiny forward), so a model can read another machine's rows."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

from chunkpilot.cache import user_cache_dir
from chunkpilot.contract import Hardware

from .models import DTYPES
from .runtime import synchronize


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


def fingerprint(device: str = "cpu") -> dict:
    """What the machine is; `hardware_id` hashes only what does not change between runs."""
    if device.startswith("cuda"):
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
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }


def _median_ms(fn, device: torch.device, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)  # a GPU runs asynchronously: the clock must wait for the work
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def measure_descriptors(dtype: str, threads: int, device: str = "cpu") -> dict:
    """Matmul GFLOP/s at the dtype, copy bandwidth GB/s, and the ms of a one-token forward of a
    one-layer model (Python + framework overhead per call), at `threads`. A GPU gets operands big
    enough to reach its throughput (1024 on a CPU, 8192 on a GPU)."""
    dev = torch.device(device)
    size, copy_mib = (1024, 64) if dev.type == "cpu" else (8192, 1024)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size, dtype=DTYPES[dtype], device=dev)
        gflops = 2 * size**3 / (_median_ms(lambda: a @ a, dev) / 1e3) / 1e9
        src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        bandwidth = 2 * src.nbytes / (_median_ms(lambda: dst.copy_(src), dev) / 1e3) / 1e9  # read + write
        config = transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
        tiny = transformers.AutoModelForCausalLM.from_config(config).to(dev).eval()
        ids = torch.zeros(1, 1, dtype=torch.long, device=dev)
        with torch.inference_mode():
            overhead = _median_ms(lambda: tiny(input_ids=ids, use_cache=False), dev, repeats=21)
    finally:
        torch.set_num_threads(previous)
    return {"matmul_gflops": gflops, "bandwidth_gbs": bandwidth, "call_overhead_ms": overhead}


def descriptors(cache_dir: Path, dtype: str, threads: int, device: str = "cpu", announce: bool = False) -> dict:
    """Fingerprint + measured descriptors for (dtype, threads), measured once per machine and
    cached in `cache_dir/<hardware_id>.json`; `announce` says so on stderr when it measures."""
    fp = fingerprint(device)
    path = cache_dir / f"{fp['hardware_id']}.json"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    key = f"{dtype}/{threads}"
    if key not in cached:
        if announce:
            print(
                f"chunkpilot: measuring this machine ({fp['hardware_id']}, {dtype}, {threads} threads) once, "
                f"a few seconds; cached in {cache_dir}",
                file=sys.stderr,
                flush=True,
            )
        cached[key] = measure_descriptors(dtype, threads, device)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        os.replace(tmp, path)
    return {**fp, **cached[key]}


def local_hardware(dtype: str, threads: int, device: str = "cpu") -> Hardware:
    """This machine as a request describes it: its id plus descriptors, measured into the user's
    cache the first time (so a machine no dataset holds still gets model decisions)."""
    found = descriptors(user_cache_dir() / "hardware", dtype, threads, device, announce=True)
    return Hardware(**{name: found[name] for name in Hardware.model_fields})
