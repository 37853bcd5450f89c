"""A duration as progress lines print it (the profiler's and training's): 1m05s, 2h03m."""

from __future__ import annotations


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
