"""`chunkpilot serve`: the predictor service on uvicorn (this process never imports torch). Its
options are the service's settings (predictor.settings), each also a CHUNKPILOT_* variable."""

from __future__ import annotations

import argparse

from chunkpilot.contract import number
from predictor.settings import Settings

from .fields import add_fields, build, values

HELP = "serve the champion chunk-size model over HTTP (FastAPI + uvicorn)"
LOG_LEVELS = ("debug", "info", "warning", "error")
ENV_ONLY = ("admin_token", "allowed_hosts")  # a secret stays off the command line (ps shows it); a list is JSON
FLAGS = {name: f"--{name.replace('_', '-')}" for name in Settings.model_fields if name not in ENV_ONLY}
UNSET = "$CHUNKPILOT_{name}, else {default}"


def add_args(parser: argparse.ArgumentParser) -> None:
    add_fields(parser, Settings, FLAGS, unset=UNSET)
    parser.add_argument("--port", default="8000")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="info: the start-up line, each model swap and failure; warning: failures only",
    )


def run(args: argparse.Namespace) -> int:
    from predictor.server import serve

    port = number("port", args.port, int, ge=1, le=65535)
    serve(build(Settings, **values(args, FLAGS)), port, args.log_level)
    return 0
