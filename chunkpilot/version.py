"""The installed package's version: what `chunkpilot --version` and the service's start-up line say."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed_version() -> str:
    try:
        return version("chunkpilot")
    except PackageNotFoundError:  # run from a source tree (the GPU machine's carried copy)
        return "(not installed: run from source)"
