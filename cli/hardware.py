"""`chunkpilot hardware`: this machine as the service's requests describe it, the `hardware` JSON an
engine sends to `POST /v1/chunk-size` (measured once per dtype and thread count into the per-user
cache, as `auto` does)."""

from __future__ import annotations

import argparse

from engine.config import EngineConfig

from .fields import add_fields, values

FLAGS = {"dtype": "--dtype", "threads": "--threads"}  # the engine's, as it would run
HELP = "print this machine's hardware descriptors as the JSON the service's requests carry"


def add_args(parser: argparse.ArgumentParser) -> None:
    add_fields(parser, EngineConfig, FLAGS)


def run(args: argparse.Namespace) -> int:
    from engine import runtime
    from engine.hardware import local_hardware

    config = EngineConfig(**values(args, FLAGS))
    configured = runtime.configure(config.threads)  # the engine's own set-up: the threads it would run with
    print(local_hardware(config.dtype, configured.threads).model_dump_json())
    return 0
