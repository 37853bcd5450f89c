"""`chunkpilot serve`: the predictor service on uvicorn (this process never imports torch)."""

from __future__ import annotations

import argparse

from chunkpilot.contract import number

HELP = "serve the champion chunk-size model over HTTP (FastAPI + uvicorn)"
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", default="8000")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="info: the start-up line, each model swap and failure; warning: failures only",
    )


def run(args: argparse.Namespace) -> int:
    from predictor.server import serve
    from predictor.settings import Settings

    port = number("port", args.port, int, ge=1, le=65535)
    serve(Settings(host=args.host), port, args.log_level)
    return 0
