"""Where the project's data lies by default (relative to the working directory), and paths built
from what a client or a tracking server said (a machine's id, a spec's name, a partition's name):
each part must be one identifier (chunkpilot.contract.IDENTIFIER), and the joined path, resolved,
must stay inside its root. Anything else is refused, never written."""

from __future__ import annotations

import re
from pathlib import Path

from .contract import IDENTIFIER, ConfigError

DATA_ROOT = Path("data/ttft")  # the dataset root: a folder per source (spec or partition), one per machine
TELEMETRY_DIR = DATA_ROOT / "telemetry"  # the default partition of the engine's own prefills
TELEMETRY_PREFIX = "telemetry-"  # the config keys of the engine's own prefills (store.dataset writes them)
SHIPPED_DIR = DATA_ROOT / "cpu-shipped"  # the profiles that come with the project
SPECS_DIR = Path("data/specs")  # the profiling specs

_IDENTIFIER = re.compile(IDENTIFIER)


class UnsafePath(ConfigError):
    """A path part that is not an identifier, or a path that leaves its root."""


def inside(root: Path, *parts: str, suffix: str = "") -> Path:
    """`root/part/.../last+suffix`, refused unless every part is an identifier and the result,
    resolved (links followed), lies under `root` resolved."""
    for part in parts:
        if not isinstance(part, str) or not _IDENTIFIER.match(part):
            raise UnsafePath("path", f"{part!r} is not an identifier ({IDENTIFIER})")
    base = Path(root).resolve()
    path = base.joinpath(*parts[:-1], parts[-1] + suffix) if parts else base
    if not path.resolve().is_relative_to(base):
        raise UnsafePath("path", f"{path} leaves {base}")
    return path
