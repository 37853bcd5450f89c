"""Real servers for tests: uvicorn on a free loopback port, in a thread or as a `chunkpilot serve`
process, stopped on exit."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from cli.processes import answers, free_port, start_mlflow_server, start_service


@contextmanager
def serve(app, port: int | None = None) -> Iterator[str]:
    """Run `app` on 127.0.0.1 until the block ends; yields its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve_process(port: int | None = None, **settings: object) -> Iterator[tuple[str, subprocess.Popen]]:
    """`chunkpilot serve` in its own process (CHUNKPILOT_* settings from keyword arguments);
    yields (base URL, process) once it listens; stopped on exit. Readiness is the test's business."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_service(port, **settings)
    try:
        wait_until(lambda: answers(f"{url}/livez") or proc.poll() is not None, seconds=60)
        if not answers(f"{url}/livez"):
            raise RuntimeError(f"chunkpilot serve did not start (exit code {proc.poll()})")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_until(check, seconds: float = 30, every: float = 0.1) -> bool:
    """Poll `check()` until it is true or `seconds` pass; returns its last value."""
    deadline = time.monotonic() + seconds
    while not (ok := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return ok


@contextmanager
def mlflow_server(backend_uri: str, artifacts: str | None = None, port: int | None = None) -> Iterator[str]:
    """A real `mlflow server` on a loopback port over `backend_uri`; yields its URL once healthy."""
    port = port or free_port()
    proc = start_mlflow_server(backend_uri, port, artifacts)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_until(lambda: answers(f"{url}/health"), seconds=90, every=0.5):
            raise RuntimeError("mlflow server did not start within 90 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@contextmanager
def postgres(folder: Path) -> Iterator[str]:
    """A real PostgreSQL server (pgserver's bundled binaries) with its data in `folder`; yields its
    SQLAlchemy URI. When it cannot start here, the calling test is skipped, saying why, on a
    developer's machine, and fails under CI=true (CI installs what it needs: a skip there hides
    that the fleet went untested)."""
    import os
    import warnings

    import pytest

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")  # platformdirs, on machines without one
        try:
            import pgserver

            server = pgserver.get_server(folder, cleanup_mode="stop")
        except Exception as exc:  # not installed, or no server on this machine: the reason goes to the report
            why = f"PostgreSQL could not start: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if os.environ.get("CI") == "true":
                pytest.fail(why, pytrace=False)
            pytest.skip(why)
    try:
        yield server.get_uri().replace("postgresql://", "postgresql+psycopg2://", 1)  # the driver installed
    finally:
        server.cleanup()


def isolated_python(root: Path) -> Path:
    """A virtualenv that sees this one's libraries (MLflow, LightGBM, uvicorn, ...) but not this
    checkout: the editable install's import hook lives in a .pth file that only this venv runs. Its
    bin/ holds a `uvicorn` (what `mlflow models serve` starts) on the same footing. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # a path, run as none
    uvicorn_script = root / "bin" / "uvicorn"
    uvicorn_script.write_text(f"#!{python}\nimport sys\nfrom uvicorn.main import main\nsys.exit(main())\n")
    uvicorn_script.chmod(0o755)
    return python
