"""The per-user cache: what ChunkPilot measures or downloads once per user and machine (the engine's
hardware descriptors, the fleet's dataset files, the compiled forests). Never the repository's data/."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$CHUNKPILOT_CACHE_DIR, else $XDG_CACHE_HOME/chunkpilot, else ~/.cache/chunkpilot."""
    if os.environ.get("CHUNKPILOT_CACHE_DIR"):
        return Path(os.environ["CHUNKPILOT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chunkpilot"


def write_atomically(path: Path, text: str) -> None:
    """`path` holding `text`, its folder made if need be: written under this process's own private
    name, then renamed, so a reader never sees half a file and two writers never share a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)
