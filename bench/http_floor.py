"""Where an HTTP decision's time goes on this machine: the floor of loopback HTTP (a bare ASGI app
on the same uvicorn, a fixed answer, asked by 8 standard-library clients one request per 50 ms
each, as bench/predictor_latency.py asks the service), and the service's own handling called
in-process through ASGI (no socket), with and without its middlewares, once its decision tables
are built. Side by side in one run. Needs a champion: run `chunkpilot train` first.

    .venv/bin/python bench/http_floor.py [--requests 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from predictor_latency import body, known_machine, over_http, percentiles

from cli.processes import free_port

ANSWER = b'{"chunk_size":512}'


async def bare(scope: dict, receive, send) -> None:
    """The floor: read the body, answer a fixed JSON."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": ANSWER})


async def call(app, payload: bytes) -> int:
    """One POST /v1/chunk-size through the ASGI app; returns the status."""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chunk-size",
        "raw_path": b"/v1/chunk-size",
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"content-length", str(len(payload)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    messages = [{"type": "http.request", "body": payload, "more_body": False}]
    status = []

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


async def handling(n: int) -> None:
    from predictor.app import create_app
    from predictor.settings import Settings
    from store.tracking import tracking_uri

    app = create_app(Settings(tracking_uri=tracking_uri(), poll_interval_s=0, explore_budget=0))
    async with app.router.lifespan_context(app):
        predictor = app.state.service.predictor
        machine = known_machine(predictor)  # the model's own decisions, as bench/predictor_latency.py asks
        payloads = [json.dumps(body(i, machine)).encode() for i in range(12, 12 + n)]
        for payload in payloads:  # every cell asked built before the timing: a warm service
            await call(app, payload)
        predictor.recipe.table.wait(600)
        middlewares = list(app.user_middleware)
        for label, kept in (("with its middlewares", middlewares), ("without middlewares", [])):
            app.user_middleware, app.middleware_stack = kept, None  # rebuilt on the next call
            times = []
            for payload in payloads:
                t0 = time.perf_counter()
                if await call(app, payload) != 200:
                    raise RuntimeError("the service did not answer 200")
                times.append((time.perf_counter() - t0) * 1e3)
            print(f"the service in-process through ASGI, {label:<21} {percentiles(times)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per row")
    args = parser.parse_args()
    if not 100 <= args.requests <= 100_000:
        parser.error(f"--requests must be between 100 and 100000 (got {args.requests})")
    port = free_port()
    here = Path(__file__).parent
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(here), "http_floor:bare", "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)
        floor = f"http://127.0.0.1:{port}"  # a fixed answer, whatever machine the requests name
        row = over_http(floor, "any", 8, max(args.requests // 8, 20), every_ms=50, lean=True)
        print(f"bare ASGI on uvicorn (the floor): {row}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=20)
    asyncio.run(handling(args.requests))


if __name__ == "__main__":
    main()
