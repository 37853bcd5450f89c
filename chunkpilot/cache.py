"""The per-user cache: what ChunkPilot measures or downloads once per user and machine (the engine's
hardware descriptors, the fleet's dataset files). Never the repository's data/."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$CHUNKPILOT_CACHE_DIR, else $XDG_CACHE_HOME/chunkpilot, else ~/.cache/chunkpilot."""
    if os.environ.get("CHUNKPILOT_CACHE_DIR"):
        return Path(os.environ["CHUNKPILOT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chunkpilot"
