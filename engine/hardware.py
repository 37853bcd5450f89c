"""The machine a row was measured on: its static fingerprint (engine/machine.py) plus descriptors
measured once and cached (matmul GFLOP/s at a dtype and thread count, memory bandwidth, the
per-call overhead of a tiny forward), so a model can read another machine's rows."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import torch
import transformers

from chunkpilot.cache import user_cache_dir, write_atomically
from chunkpilot.contract import Hardware, descriptor_key
from store.dataset import contended_limit

from .contention import ForeignLoad
from .machine import fingerprint
from .models import DTYPES
from .runtime import synchronize


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


@functools.cache
def matmul_peak(dtype: str, threads: int, device: str = "cpu") -> float:
    """This process's best matmul GFLOP/s at the dtype and threads: the fastest of square products
    large enough to reach the machine's throughput (the descriptor's single 1024 product is a
    feature of a machine, measured once and cached; this is the bar a prefill's GFLOP/s is held to,
    measured where the prefill runs). Measured once per process, a few seconds."""
    dev = torch.device(device)
    sizes = (1024, 2048, 3072) if dev.type == "cpu" else (4096, 8192, 16384)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = 0.0
        for size in sizes:
            a = torch.randn(size, size, dtype=DTYPES[dtype], device=dev)
            best = max(best, 2 * size**3 / (_median_ms(lambda a=a: a @ a, dev, repeats=3) / 1e3) / 1e9)
    finally:
        torch.set_num_threads(previous)
    return best


TRIES = 3  # measurements beside other work before the descriptors are used uncached


def descriptors(cache_dir: Path, dtype: str, threads: int, device: str = "cpu", announce: bool = False) -> dict:
    """Fingerprint + measured descriptors for (dtype, threads), measured once per machine and
    cached in `cache_dir/<hardware_id>.json`; `announce` says so on stderr when it measures. A
    measurement beside other work (engine.contention: a test suite, a service compiling its forests)
    reads the machine slow, a third of its matmul GFLOP/s here, and a cached one would describe it
    so to the service and in every telemetry row for good: it is taken again, up to TRIES times,
    and one still contended serves this process only, uncached, saying so."""
    fp = fingerprint(device)
    path = cache_dir / f"{fp['hardware_id']}.json"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    key = descriptor_key(dtype, threads)
    if key in cached:
        return {**fp, **cached[key]}
    if announce:
        print(
            f"chunkpilot: measuring this machine ({fp['hardware_id']}, {dtype}, {threads} threads) once, "
            f"a few seconds; cached in {cache_dir}",
            file=sys.stderr,
            flush=True,
        )
    for _ in range(TRIES):
        with ForeignLoad() as load:
            measured = measure_descriptors(dtype, threads, device)
        if (load.cores or 0.0) <= contended_limit():
            cached[key] = measured
            write_atomically(path, json.dumps(cached, indent=1, sort_keys=True))
            return {**fp, **measured}
    print(
        f"chunkpilot: other work kept {load.cores:.2f} cores busy while this machine was measured "
        f"({TRIES} times): its descriptors are not cached, the next process measures again",
        file=sys.stderr,
        flush=True,
    )
    return {**fp, **measured}


def local_hardware(dtype: str, threads: int, device: str = "cpu") -> Hardware:
    """This machine as a request describes it: its id plus descriptors, measured into the user's
    cache the first time (a machine no dataset holds is still priced: the anchor's size until its
    own prefills teach the service's correction, then the model's decisions)."""
    found = descriptors(user_cache_dir() / "hardware", dtype, threads, device, announce=True)
    return Hardware(**{name: found[name] for name in Hardware.model_fields})


@functools.cache
def this_machine(device: str = "cpu") -> Hardware:
    """This machine by its id alone, read from the OS, never measured: what the engine's requests
    name (`auto` sends `local_hardware`'s descriptors in its place)."""
    return Hardware(hardware_id=fingerprint(device)["hardware_id"])
