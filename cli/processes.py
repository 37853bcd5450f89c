"""The service as a child process: a free port, `chunkpilot serve` started with settings in its
environment, and waiting until it answers. Used by the demo, the benches and the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(port: int, **settings: object) -> subprocess.Popen:
    """`chunkpilot serve` in a new process; `settings` become its CHUNKPILOT_* environment."""
    from chunkpilot.tracking import tracking_uri

    settings = {"tracking_uri": tracking_uri(), "poll_interval_s": 0, **settings}
    env = {**os.environ, **{f"CHUNKPILOT_{k.upper()}": str(v) for k, v in settings.items()}}
    return subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port)], env=env)


def answers(url: str) -> bool:
    """GET `url` gives 200 (False while nothing listens or it says otherwise)."""
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if answers(f"{url}/readyz"):
            return
        time.sleep(0.3)
    raise RuntimeError(f"the service at {url} did not become ready")
