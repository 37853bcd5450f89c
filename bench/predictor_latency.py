"""Decision latency of the predictor: in-process (the recipe at the exact length, today's path before
the table; the decision table at first sight of a kind, the model's or one it does not know, back to
back and after an idle pause as between an engine's prefills, and in the steady state, with its
build time per kind) and over HTTP against a real `chunkpilot serve` process on loopback. Each HTTP
client is its own process with one keep-alive connection, as engines are (client threads in one
process would measure the GIL's 5 ms switch interval, not the service), asking back to back
(saturation) or paced (one request per --every-ms, like an engine asking before each prefill). The
clients use the engine's own client (auto.connection, on the standard library's http.client); rows
of the paced cases repeat them with httpx, a general-purpose client, to show the client's share.
Clients share the machine's cores with the server. Needs a champion in the MLflow store: run
`chunkpilot train` (or `make demo`) first.

    .venv/bin/python bench/predictor_latency.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.records import append_record, stamp

if TYPE_CHECKING:
    from predictor.model import Predictor

MODELS = ["llama-tiny", "mistral-44m", "qwen2-gqa"]
# model shapes no training row ran (a user's own models): the anchor's size is the recipe's decision
NEW_SHAPES = [
    {"family": "llama", "num_layers": layers, "hidden_size": 384, "num_heads": 6, "num_kv_heads": 2}
    | {"intermediate_size": 1024, "vocab_size": 8000}
    for layers in (6, 7, 8)
]


def body(i: int, machine: str, schedule: bool = False, models: list = MODELS, threads: int = 2) -> dict:
    """Twelve kinds of request (3 models x 4 attention set-ups) on the profiled machine `machine` at
    `threads` (another count: twelve more kinds), each request a length not asked before (distinct
    up to i = 20,000): a decision the table answers from a segment, never a repeat."""
    window = [None, 512, 1024, 2048][i % 4]
    return {
        "schedule": schedule,
        "context_length": 500 + (i * 7919) % 20_000,
        "model": models[i % len(models)],
        "attention": {"window": window, "layout": "ring" if window == 1024 else "shift"},
        "threads": threads,
        "hardware": {"hardware_id": machine},
    }


def known_machine(predictor: Predictor) -> str:
    """A machine the champion was trained on with the bundled engine's default kernel, this one if
    it was: requests naming it are the model's to decide (one it never saw is the anchor's)."""
    from chunkpilot.contract import ChunkRequest
    from engine.machine import fingerprint
    from judge.lineup import anchor_key

    backend, kernel = (ChunkRequest.model_fields[name].default for name in ("backend", "attn_impl"))
    here = fingerprint()["hardware_id"]
    for machine in sorted(predictor.recipe.hardware, key=lambda m: m != here):
        if anchor_key(machine, backend, kernel) in predictor.recipe.anchors:
            return machine
    raise SystemExit("the champion was trained on no machine with the bundled engine's default kernel")


IDLE_S = 0.05  # a pause before a first sight, as between an engine's prefills
FIGURES: list[dict] = []  # what this run measured, in order: its record (evaluation.records)


def percentiles(ms: list[float], path: str | None = None) -> str:
    """p50 and p99 of `ms`, kept under `path` for the record when one is named."""
    p50, p99 = statistics.median(ms), statistics.quantiles(ms, n=100)[98]
    if path is not None:
        FIGURES.append({"path": path, "p50_ms": p50, "p99_ms": p99, "n": len(ms)})
    return f"p50 {p50:7.3f} ms   p99 {p99:7.3f} ms"


def timed(answer: Callable, requests: list) -> tuple[list[float], list]:
    times, answers = [], []
    for r in requests:
        t0 = time.perf_counter()
        answers.append(answer(r))
        times.append((time.perf_counter() - t0) * 1e3)
    return times, answers


def in_process(n: int) -> str:
    """The in-process rows; returns the profiled machine the requests name."""
    from chunkpilot.contract import ChunkRequest
    from predictor.model import load_predictor
    from store.registry import CHAMPION, MODEL_NAME
    from store.tracking import tracking_uri

    def loaded() -> Predictor:
        return load_predictor(tracking_uri(), MODEL_NAME, CHAMPION, compiled=False)

    predictor = loaded()
    machine = known_machine(predictor)
    print(f"requests name the profiled machine {machine}")

    def asked(i: int, **change) -> ChunkRequest:
        return ChunkRequest.model_validate(body(i, machine, **change))

    requests = [asked(i) for i in range(n)]
    lgbm, _ = timed(predictor.exact_answer, requests[: max(100, n // 4)])
    path = "in-process, recipe at the exact length, LightGBM's own predictor (until the forests are compiled)"
    print(f"in-process, recipe, LightGBM's predictor {percentiles(lgbm, path)}")
    with tempfile.TemporaryDirectory() as cache:  # empty: what a new machine or model pays, once
        t0 = time.perf_counter()
        predictor.recipe.cost.compile(Path(cache))
        cold = time.perf_counter() - t0
        again = loaded()
        t0 = time.perf_counter()
        again.recipe.cost.compile(Path(cache))
        cached = time.perf_counter() - t0
        FIGURES.append({"path": "compiling the forests, once per machine and model (one core)", "seconds": cold})
        FIGURES.append({"path": "loading the compiled forests from the cache", "seconds": cached})
        print(
            f"compiling the forests                    {cold:.1f} s of one core, once per machine and model "
            f"(then {cached:.2f} s from the cache)"
        )
        again.close()
    requests = [asked(i) for i in range(n, 2 * n)]  # lengths not priced before
    exact, _ = timed(predictor.exact_answer, requests)
    path = "in-process, recipe at the exact length, compiled forests (every decision before the table)"
    print(f"in-process, recipe at the exact length   {percentiles(exact, path)}")
    # each kind's first request, at lengths never priced: its cell built now, in the request (or,
    # past the budget, the anchor's answer and the cell built behind: finished before the next kind)
    first = []
    for i in range(3 * n, 3 * n + 12):
        predictor.recipe.table.wait(60)
        first += timed(predictor.answer, [asked(i)])[0]
    path = "in-process, first sight of a kind (12 kinds: its cell built now, in the request)"
    print(f"in-process, first sight of a kind        {percentiles(first, path)}")
    # the same, each after an idle pause: an engine asks once the previous prefill is done, and by then
    # the decision's code and data are out of the caches, which back-to-back requests keep warm
    idle = []
    for i in range(3 * n, 3 * n + 12):
        predictor.recipe.table.wait(60)
        time.sleep(IDLE_S)
        idle += timed(predictor.answer, [asked(i, threads=1)])[0]
    path = f"in-process, first sight of a kind after {IDLE_S * 1e3:g} ms idle (12 more kinds: one thread)"
    print(f"in-process, first sight after idle       {percentiles(idle, path)}")
    # a model shape no row ran: the anchor's size at once, its cell built behind without the forests
    unknown = []
    for i in range(3 * n, 3 * n + 12):
        predictor.recipe.table.wait(60)
        unknown += timed(predictor.answer, [asked(i, models=NEW_SHAPES)])[0]
    path = "in-process, first sight of a kind the model does not know (12 kinds of a new model shape: the anchor)"
    print(f"in-process, first sight, unknown shape   {percentiles(unknown, path)}")
    fresh = [asked(i) for i in range(3 * n + 12, 3 * n + 24)]
    crowded, _ = timed(predictor.answer, fresh)
    path = "in-process, a new cell of each of 12 kinds, back to back"
    print(f"in-process, new cells back to back       {percentiles(crowded, path)}")
    t0 = time.perf_counter()
    predictor.recipe.table.wait(600)
    built = predictor.recipe.table.built_s
    if built:  # cells the budget left to the background thread
        path = "table build per batch of a kind's asked cells, background thread (median)"
        FIGURES.append({"path": path, "seconds": statistics.median(built)})
        print(
            f"table build, per batch of cells, behind  median {statistics.median(built):.4f} s, "
            f"max {max(built):.4f} s, {len(built)} builds in {time.perf_counter() - t0:.1f} s"
        )
    fresh = [asked(i) for i in range(2 * n, 3 * n)]  # lengths not asked before
    timed(predictor.answer, fresh)  # their cells built (in these requests, or behind): the steady state follows
    predictor.recipe.table.wait(600)
    steady, answers = timed(predictor.answer, fresh)
    sources = {s: sum(a.source == s for a in answers) for s in ("table", "anchor", "model")}
    path = "in-process, table, every cell built (the steady state)"
    print(f"in-process, table, cells built           {percentiles(steady, path)}  sources {sources}")
    ttft = statistics.median(a.predicted_ttft_ms for a in answers)
    print(
        f"decision cost / median predicted TTFT ({ttft:.0f} ms) of these requests: table p50 "
        f"{statistics.median(steady) / ttft:.4%}, recipe p50 {statistics.median(exact) / ttft:.2%}"
    )
    if predictor.info["schedules"]:  # the same requests asking for a schedule too (priced per length)
        scheduled, _ = timed(predictor.answer, [r.model_copy(update={"schedule": True}) for r in fresh])
        path = "in-process, recipe + schedule (priced per length, never tabled)"
        print(f"in-process, recipe + schedule            {percentiles(scheduled, path)}")
    predictor.close()
    return machine


def compiled_forests(url: str) -> None:
    """Wait until the service has compiled its forests (or read them from the cache)."""
    import httpx

    deadline = time.monotonic() + 600
    while httpx.get(f"{url}/v1/model").json()["forests"] == "compiling":
        if time.monotonic() > deadline:
            raise RuntimeError("the service did not compile its forests within 10 minutes")
        time.sleep(1)


def built_cells(url: str, machine: str, count: int) -> None:
    """Ask each of the first `count` requests once (its cell built in that request, or behind it),
    then until every kind answers from its table: the HTTP rows time a warm service."""
    import httpx

    with httpx.Client(base_url=url, timeout=30) as http:
        for i in range(count):
            http.post("/v1/chunk-size", json=body(i, machine)).raise_for_status()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            sources = [http.post("/v1/chunk-size", json=body(i, machine)).json()["source"] for i in range(count)]
            if sources.count("table") == count:
                return
            time.sleep(1)
    raise RuntimeError("the service's decision table was not built within 10 minutes")


def engine_post(url: str) -> Callable[[dict], None]:
    """The engine's own client (auto.connection), the body serialised as AutoPolicy sends it."""
    from auto.connection import ServiceConnection

    connection = ServiceConnection(url, 5.0)
    return lambda b: connection.post("/v1/chunk-size", json.dumps(b).encode())


def httpx_post(url: str) -> Callable[[dict], None]:
    """httpx, a general-purpose client, with the same body: the difference is the client's."""
    import httpx

    http = httpx.Client(base_url=url, timeout=5)
    headers = {"content-type": "application/json"}
    return lambda b: http.post("/v1/chunk-size", content=json.dumps(b).encode(), headers=headers).raise_for_status()


def client(job: tuple) -> list[float]:
    """One engine: connect, warm up, then `n` requests from `start_at` on its schedule."""
    url, machine, k, n, every_s, start_at, general, schedule = job
    post = (httpx_post if general else engine_post)(url)
    time.sleep(max(0.0, start_at - 1.0 - time.time()))  # warm up just before: keep-alive closes idle connections
    for i in range(5):
        post(body(k * n + i, machine, schedule))
    times = []
    for i in range(n):
        time.sleep(max(0.0, start_at + i * every_s - time.time()))
        t0 = time.perf_counter()
        post(body(k * n + i, machine, schedule))
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def over_http(
    url: str,
    machine: str,
    clients: int,
    per_client: int,
    every_ms: float = 0.0,
    general: bool = False,
    schedule: bool = False,
    record: bool = True,
) -> str:
    """`clients` processes. every_ms 0: back to back (latency = clients / throughput); else each
    asks on a fixed timetable, spread evenly over the period. `general`: httpx in place of the
    engine's client; `schedule`: ask for chunk schedules."""
    every_s = every_ms / 1e3
    start_at = time.time() + 2.0 + 0.3 * clients  # every process started by then
    jobs = [
        (url, machine, k, per_client, every_s, start_at + k * every_s / clients, general, schedule)
        for k in range(clients)
    ]
    with multiprocessing.get_context("spawn").Pool(clients) as pool:
        results = pool.map(client, jobs)
    times = [t for r in results for t in r]
    wall = max(time.time() - start_at, 1e-9)
    mode = f"one request per {every_ms:g} ms each" if every_ms else "back to back"
    who = ("httpx" if general else "engine client") + (" + schedule" if schedule else "")
    said = percentiles(times, f"HTTP {who}, {clients} clients, {mode}" if record else None)
    return f"HTTP {who:>17}, {clients:>2} clients, {mode:<28} {said}   {len(times) / wall:6.0f} req/s"


def main() -> None:
    from cli.processes import free_port, start_service, wait_ready

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per HTTP row")
    args = parser.parse_args()
    if not 100 <= args.requests <= 1_000_000:  # percentiles need a few requests per client
        parser.error(f"--requests must be between 100 and 1000000 (got {args.requests})")
    machine = in_process(args.requests)
    port = free_port()
    server = start_service(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        compiled_forests(url)
        built_cells(url, machine, args.requests + 5)  # every length a client asks (its warm-up's too)
        over_http(url, machine, 1, 300, record=False)  # warm-up, not shown
        print(over_http(url, machine, 1, args.requests))
        for clients in (8, 32):
            print(over_http(url, machine, clients, args.requests // clients))
        print(over_http(url, machine, 1, max(args.requests // 8, 20), every_ms=50))
        print(over_http(url, machine, 1, max(args.requests // 8, 20), every_ms=50, general=True))
        for every_ms in (10, 50):
            print(over_http(url, machine, 8, max(args.requests // 8, 20), every_ms=every_ms))
        print(over_http(url, machine, 8, max(args.requests // 8, 20), every_ms=50, general=True))
        print(over_http(url, machine, 8, max(args.requests // 8, 20), every_ms=50, schedule=True))
        print(over_http(url, machine, 32, max(args.requests // 32, 20), every_ms=50))
    finally:
        server.terminate()
        server.wait(timeout=20)
    command = shlex.join([".venv/bin/python", "bench/predictor_latency.py", *sys.argv[1:]])
    where = append_record({**stamp(command), "kind": "latency", "figures": FIGURES})
    print(f"recorded in {where} (`chunkpilot results` renders docs/performance.md)")


if __name__ == "__main__":
    main()
