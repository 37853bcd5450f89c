"""What the engine benches share: `--model` and `--rounds`, checked, and the engine they build."""

from __future__ import annotations

import argparse

from chunkpilot.contract import ConfigError, number
from engine.config import EngineConfig
from engine.engine import Engine


def model_and_rounds(doc: str) -> tuple[argparse.Namespace, Engine]:
    """(the parsed arguments, an engine of --model); `doc`'s first line is the --help description."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny", help="preset, checkpoint folder or shape file")
    parser.add_argument("--rounds", default="5", help="measured rounds after the warm-up (1-1000)")
    args = parser.parse_args()
    try:
        args.rounds = number("rounds", args.rounds, int, ge=1, le=1000)
        return args, Engine(EngineConfig(model=args.model))
    except ConfigError as exc:  # one line naming the field, as the CLI says it
        parser.error(str(exc))
