"""`chunkpilot hardware`: this machine as the service's requests describe it, the `hardware` JSON an
engine sends to `POST /v1/chunk-size` (measured once per dtype and thread count into the per-user
cache, as `auto` does)."""

from __future__ import annotations

import argparse

from chunkpilot.contract import DTYPES, number

HELP = "print this machine's hardware descriptors as the JSON the service's requests carry"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", help="the engine's torch threads (default: every core, as the engine)")


def run(args: argparse.Namespace) -> int:
    from engine import runtime
    from engine.hardware import local_hardware

    threads = None if args.threads is None else number("threads", args.threads, int, ge=1, le=1024)
    configured = runtime.configure(threads)  # the engine's own set-up: the threads it would run with
    print(local_hardware(args.dtype, configured.threads).model_dump_json())
    return 0
