"""`chunkpilot hardware`: this machine as the service's requests describe it, the `hardware` JSON an
engine sends to `POST /v1/chunk-size` (measured once per dtype and thread count into the per-user
cache, as `auto` does); with `--available-memory`, the memory free for a prefill now, in MB (what
a `memory_budget_mb` may be at most)."""

from __future__ import annotations

import argparse

from engine.config import EngineConfig

from .fields import add_fields, values

FLAGS = {"dtype": "--dtype", "threads": "--threads"}  # the engine's, as it would run
HELP = "print this machine's hardware descriptors as the JSON the service's requests carry"


def add_args(parser: argparse.ArgumentParser) -> None:
    add_fields(parser, EngineConfig, FLAGS)
    parser.add_argument(
        "--available-memory",
        action="store_true",
        help="print the memory free now (MemAvailable, or the container's limit if lower), MB, and nothing else",
    )


def run(args: argparse.Namespace) -> int:
    if args.available_memory:
        from engine.machine import available_memory_bytes  # no torch: answers at once

        print(f"{available_memory_bytes() / 2**20:.0f}")
        return 0
    from engine import runtime
    from engine.hardware import local_hardware

    config = EngineConfig(**values(args, FLAGS))
    configured = runtime.configure(config.threads)  # the engine's own set-up: the threads it would run with
    print(local_hardware(config.dtype, configured.threads).model_dump_json())
    return 0
