"""Decision latency of the predictor: in-process (the model alone, and through the LRU cache) and
over HTTP against a real `chunkpilot serve` process on loopback with 1, 8 and 32 concurrent
clients (keep-alive, one connection each), back to back (saturation) and paced (each client one
request per --every-ms, like engines asking before each prefill). The clients run in this
process, on the same cores as the server. Needs a champion in the MLflow store: run
`chunkpilot train` (or `make demo`) first.

    .venv/bin/python bench/predictor_latency.py [--requests 2000] [--every-ms 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from chunkpilot.demo import free_port, start_service, wait_ready  # noqa: E402
from chunkpilot.tracking import tracking_uri  # noqa: E402
from predictor.model import DecisionCache, load_predictor  # noqa: E402
from predictor.schemas import ChunkRequest  # noqa: E402

HARDWARE = {"matmul_gflops": 250.0, "bandwidth_gbs": 40.0, "call_overhead_ms": 0.9, "cores": 2}


def body(i: int) -> dict:
    """Requests that differ (so the cache does not answer all of them)."""
    window = [None, 512, 1024, 2048][i % 4]
    return {"context_length": 500 + 37 * (i % 400), "model": ["llama-tiny", "mistral-44m", "qwen2-gqa"][i % 3],
            "attention": {"window": window, "layout": "ring" if window == 1024 else "shift"},
            "threads": 2, "hardware": HARDWARE}


def percentiles(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=100)
    return f"p50 {statistics.median(ms):7.3f} ms   p99 {q[98]:7.3f} ms"


def in_process(n: int) -> None:
    predictor = load_predictor(tracking_uri(), "chunk-size-predictor", "champion")
    requests = [ChunkRequest.model_validate(body(i)) for i in range(n)]
    for r in requests[:50]:
        predictor.decide(r)  # warm-up
    times = []
    for r in requests:
        t0 = time.perf_counter()
        predictor.decide(r)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"in-process, model every time       {percentiles(times)}")
    cache, times = DecisionCache(4096), []
    for r in requests * 2:  # the second pass hits the cache
        t0 = time.perf_counter()
        key = r.model_dump_json()
        if cache.get(key) is None:
            cache.put(key, predictor.decide(r))
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"in-process, through the LRU cache  {percentiles(times[len(requests):])}  (cache hits)")


def over_http(url: str, clients: int, per_client: int, every_ms: float = 0.0) -> None:
    """`clients` threads, one keep-alive connection each. every_ms 0: back to back (saturation,
    latency = clients / throughput); else each client asks on a fixed schedule, as an engine
    asking once before each prefill does."""
    times: list[float] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        mine = []
        with httpx.Client(base_url=url, timeout=5) as http:
            start = time.perf_counter() + k * every_ms / clients / 1e3  # spread the schedules
            for i in range(per_client):
                time.sleep(max(0.0, start + i * every_ms / 1e3 - time.perf_counter()))
                t0 = time.perf_counter()
                response = http.post("/v1/chunk-size", json=body(k * per_client + i))
                mine.append((time.perf_counter() - t0) * 1e3)
                response.raise_for_status()
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    mode = f"one request per {every_ms:g} ms each" if every_ms else "back to back"
    print(f"HTTP, {clients:>2} clients, {mode:<28} {percentiles(times)}   {len(times) / wall:6.0f} req/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--every-ms", type=float, default=50.0, help="paced clients: one request per this many ms")
    args = parser.parse_args()
    in_process(args.requests)
    port = free_port()
    server = start_service(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        over_http(url, 1, 200)  # warm-up
        for clients in (1, 8, 32):
            over_http(url, clients, max(args.requests // clients, 20))
        for clients in (8, 32):
            over_http(url, clients, max(args.requests // clients, 20), every_ms=args.every_ms)
    finally:
        server.terminate()
        server.wait(timeout=20)


if __name__ == "__main__":
    main()
