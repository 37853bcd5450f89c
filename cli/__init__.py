"""`chunkpilot` console script: one subcommand per part; each imports its part only when run,
so `chunkpilot --help` and the light parts stay fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from chunkpilot.contract import ConfigError
from chunkpilot.version import installed_version


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit status 2, no usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    # each command's module adds its own arguments and imports torch only inside its `run`
    from . import demo, hardware, prefill, profile, results, retrain, serve, train

    parser = OneLineParser(prog="chunkpilot", description="Per-request prefill chunk sizes, from measurements.")
    parser.add_argument("--version", action="version", version=f"chunkpilot {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for module in (prefill, profile, train, retrain, serve, hardware, demo, results):
        name = module.__name__.rsplit(".", 1)[1]
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_args(command)
        command.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"chunkpilot {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"chunkpilot {args.command}: interrupted", file=sys.stderr)
        return 130
