"""Servers as child processes: a free port, `chunkpilot serve` started with settings in its
environment, `mlflow server` over a store, and waiting until they answer. Used by the demo, the
benches, the tools and the tests."""

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
    from store.tracking import tracking_uri

    settings = {"tracking_uri": tracking_uri(), "poll_interval_s": 0, **settings}
    env = {**os.environ, **{f"CHUNKPILOT_{k.upper()}": str(v) for k, v in settings.items()}}
    # failures only: the caller (the demo, a bench, a test) prints its own progress
    command = [sys.executable, "-m", "cli", "serve", "--port", str(port), "--log-level", "warning"]
    return subprocess.Popen(command, env=env)


def start_mlflow_server(store: str, port: int, artifacts: str | None = None) -> subprocess.Popen:
    """`mlflow server` over `store` on 127.0.0.1:`port` (artifacts served from `artifacts` if given),
    its output discarded. Without MLflow's job execution: ChunkPilot runs no server-side jobs, and
    with them each server starts seven more Python processes (huey consumers) that take seconds of
    CPU to start and to stop."""
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--backend-store-uri", store, "--workers", "1"]
    if artifacts is not None:
        command += ["--artifacts-destination", artifacts]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
