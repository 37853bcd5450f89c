"""Under load and faults, on real servers and real MLflow stores: 32 clients against `chunkpilot
serve`, a champion promoted while clients run, the service killed under the engine, a broken
tracking store / alias / artifact at start, property tests of the decision, and the security rules
(admin token, loopback by default, no unpickling anywhere). Latency figures go to the test log
(`pytest -s`); nothing here asserts a wall-clock speed, only bounds on added delay."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import quick, sqlite_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import answers, free_port, mlflow_server, postgres, serve, serve_process, wait_until

from auto.client import AutoPolicy, Breaker
from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks, max_chunk
from chunkpilot.contract import PRESETS, AttentionConfig, ChunkRequest, Hardware
from engine.workload import Workload
from estimator.decide import Infeasible
from predictor.app import create_app
from predictor.model import load_predictor
from predictor.settings import Settings
from store.registry import MODEL_NAME

HARDWARE = {"matmul_gflops": 250.0, "bandwidth_gbs": 40.0, "call_overhead_ms": 0.9, "cores": 2}

TESTS = Path(__file__).parent  # a child run from here imports the test helpers (servers.py)


def body(i: int) -> dict:
    """Request i of a fixed set: models, windows, layouts and lengths vary with i."""
    window = [None, 256, 512, 1024][i % 4]
    return {
        "context_length": 200 + 97 * i,
        "model": ["llama-tiny", "qwen2-gqa", "mistral-44m"][i % 3],
        "attention": {"window": window, "layout": "ring" if i % 8 == 1 else "shift"},
        "threads": 1 + i % 2,
        "hardware": HARDWARE,
    }


def is_ready(url: str) -> bool:
    return answers(f"{url}/readyz")


@dataclass
class Load:
    """What clients saw: per answered request (body index, model version, chunk, prediction)."""

    latencies_ms: list[float] = field(default_factory=list)
    answers: list[tuple[int, str, int, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def join(self) -> None:
        for t in self.threads:
            t.join()


def hammer(url: str, clients: int, bodies: list[dict], stop: threading.Event) -> Load:
    """`clients` threads, one keep-alive connection each, posting `bodies` round-robin until `stop`."""
    load, lock = Load(), threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=10) as http:
            i = k
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    response = http.post("/v1/chunk-size", json=bodies[i % len(bodies)])
                    ms = (time.perf_counter() - t0) * 1e3
                    with lock:
                        if response.status_code != 200:
                            load.errors.append(f"{response.status_code}: {response.text[:120]}")
                        else:
                            answer = response.json()
                            load.latencies_ms.append(ms)
                            load.answers.append(
                                (
                                    i % len(bodies),
                                    answer["model_version"],
                                    answer["chunk_size"],
                                    answer["predicted_ttft_ms"],
                                )
                            )
                except (httpx.HTTPError, ValueError, KeyError) as exc:  # refused, timed out, not the JSON we expect
                    with lock:
                        load.errors.append(f"{type(exc).__name__}: {exc}")
                i += clients

    load.threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in load.threads:
        t.start()
    return load


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def listening_hosts(port: int) -> set[str]:
    """Addresses bound in LISTEN state on `port` (from /proc/net/tcp{,6})."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                hosts.add(
                    ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)) if len(address) == 8 else address
                )
    return hosts


def test_32_clients_get_no_errors_and_the_service_memory_stays_flat(trained_store):
    port = free_port()
    with serve_process(port, tracking_uri=trained_store) as (url, proc):
        assert wait_until(lambda: is_ready(url))
        assert listening_hosts(port) == {"127.0.0.1"}  # loopback unless told otherwise
        bodies = [body(i) for i in range(64)]
        for b in bodies:  # the decision cache fills before the memory is watched
            assert httpx.post(f"{url}/v1/chunk-size", json=b).status_code == 200
        stop, samples = threading.Event(), []
        load = hammer(url, 32, bodies, stop)
        for _ in range(40):  # 8 s of load, memory sampled every 0.2 s
            samples.append(rss_bytes(proc.pid))
            time.sleep(0.2)
        stop.set()
        load.join()
    quarter = len(samples) // 4
    first, last = statistics.fmean(samples[:quarter]), statistics.fmean(samples[-quarter:])
    q = statistics.quantiles(load.latencies_ms, n=100)
    print(
        f"\n32 clients, 8 s: {len(load.latencies_ms)} requests, {len(load.errors)} errors, "
        f"p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms; service RSS {first / 2**20:.1f} -> {last / 2**20:.1f} MiB"
    )
    assert load.errors == [] and len(load.latencies_ms) > 100
    assert last < 1.05 * first


def test_champion_promoted_under_load_swaps_without_a_failed_or_mixed_answer(tmp_path, small_dataset, monkeypatch):
    from mlflow import MlflowClient

    uri = sqlite_store(tmp_path / "swap.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    two_versions(small_dataset, uri)
    bodies = [body(i) for i in range(16)]
    # a telemetry folder of its own: outcomes other tests in this worker reported would teach both
    # versions' corrections, and their answers would no longer be each version's own
    settings = Settings(tracking_uri=uri, poll_interval_s=0.2, telemetry_dir=tmp_path / "telemetry")
    with serve(create_app(settings)) as url:
        stop = threading.Event()
        load = hammer(url, 8, bodies, stop)
        assert wait_until(lambda: len(load.answers) > 100)  # clients run on v1 first
        MlflowClient(tracking_uri=uri).set_registered_model_alias(MODEL_NAME, "champion", "2")  # the promotion
        assert wait_until(lambda: httpx.get(f"{url}/v1/model").json()["version"] == "2")
        time.sleep(1.0)  # clients keep going on the new version
        stop.set()
        load.join()
    assert_each_answer_from_one_version(load, own_answers(uri, bodies))


def two_versions(data: Path, uri: str) -> None:
    """Versions 1 and 2 registered (trained before the load starts: what is under test is the alias
    moving while clients run, not training's speed beside them), `champion` on v1."""
    from mlflow import MlflowClient

    from training.train import train

    train(data, **quick())
    train(data, **quick(learning_rate=0.3, num_leaves=7))  # v2, whatever the gate said
    MlflowClient(tracking_uri=uri).set_registered_model_alias(MODEL_NAME, "champion", "1")


def own_answers(uri: str, bodies: list[dict]) -> dict[tuple[int, str], set[tuple[int, float]]]:
    """(body index, version) -> its (chunk, predicted ms) from the recipe at the exact length, as the
    tests' services answer (no decision tables, no budget: tests/conftest.py): versions 1 and 2,
    each loaded on its own."""
    from mlflow import MlflowClient

    expected = {}
    for version in ("1", "2"):
        MlflowClient(tracking_uri=uri).set_registered_model_alias(MODEL_NAME, f"check-{version}", version)
        predictor = load_predictor(uri, MODEL_NAME, f"check-{version}", budget=1.0, tabled=False)
        for i, b in enumerate(bodies):
            decision = predictor.answer(ChunkRequest.model_validate(b))
            expected[i, version] = {(decision.chunk_size, decision.predicted_ttft_ms)}
        predictor.close()
    return expected


def assert_each_answer_from_one_version(load: Load, expected: dict) -> None:
    """No request failed, both versions answered, and every answer is exactly its version's own."""
    assert load.errors == []
    assert {version for _, version, *_ in load.answers} == {"1", "2"}
    mixed = [(i, v, c, ms) for i, v, c, ms in load.answers if (c, ms) not in expected[i, v]]
    assert not mixed, mixed[:3]


def test_two_replicas_follow_one_alias_through_a_promotion(tmp_path, small_dataset, monkeypatch):
    """Two `chunkpilot serve` processes against one real `mlflow server` on PostgreSQL (artifacts
    served by the server), both under load: a promotion moves the alias, both serve the new version within a few alias
    polls, no request fails, and every answer is exactly one version's own. A replica keeps no state
    but its model and its answer cache, so N of them sit behind any HTTP load balancer."""
    from mlflow import MlflowClient

    poll_s = 0.5
    with postgres(tmp_path / "pg") as backend, mlflow_server(backend, str(tmp_path / "artifacts")) as store:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
        monkeypatch.chdir(tmp_path)
        two_versions(small_dataset, store)  # through the server
        bodies = [body(i) for i in range(12)]
        with (
            serve_process(tracking_uri=store, poll_interval_s=poll_s, telemetry_dir=tmp_path / "t1") as (first, _),
            serve_process(tracking_uri=store, poll_interval_s=poll_s, telemetry_dir=tmp_path / "t2") as (second, _),
        ):
            replicas = (first, second)
            assert wait_until(lambda: all(is_ready(u) for u in replicas), seconds=60)
            stop = threading.Event()
            loads = [hammer(url, 3, bodies, stop) for url in replicas]
            assert wait_until(lambda: all(len(load.answers) > 50 for load in loads))  # on v1 first
            MlflowClient(tracking_uri=store).set_registered_model_alias(MODEL_NAME, "champion", "2")  # the promotion
            assert wait_until(
                lambda: all(httpx.get(f"{u}/v1/model").json()["version"] == "2" for u in replicas), seconds=20 * poll_s
            )
            time.sleep(1.0)  # clients keep going on the new version
            stop.set()
            for load in loads:
                load.join()
        expected = own_answers(store, bodies)
    for load in loads:
        assert_each_answer_from_one_version(load, expected)


def test_engine_completes_every_prefill_while_the_service_dies_and_returns(trained_store, engines):
    engine = engines("llama-tiny")
    port = free_port()
    timeout_s, cooldown_s = 1.0, 1.0  # a fresh service's first answers share its cores with its forests' compiler
    policy = AutoPolicy(
        f"http://127.0.0.1:{port}", timeout_s, Hardware(**HARDWARE), Breaker(failures=2, cooldown_s=cooldown_s)
    )
    lengths = iter(int(100 * 1.3**k) for k in range(40))  # a new bucket every time: each prefill asks
    attention = AttentionConfig(256, "shift", 0)

    def prefill():
        n = next(lengths)
        return engine.run(Workload(n, attention), policy)

    with serve_process(port, tracking_uri=trained_store) as (url, proc):
        assert wait_until(lambda: is_ready(url))
        served = [prefill() for _ in range(3)]
        proc.kill()
        proc.wait()
        dead = [prefill() for _ in range(4)]
        assert policy.breaker.is_open
    with serve_process(port, tracking_uri=trained_store) as (url, _):
        assert wait_until(lambda: is_ready(url))
        time.sleep(cooldown_s)
        back = [prefill() for _ in range(3)]
    policy.close()
    assert [r.decision.source for r in served] == ["service"] * 3
    assert [r.decision.source for r in dead] == ["fallback"] * 4
    assert [r.decision.source for r in back] == ["service"] * 3 and not policy.breaker.is_open
    assert all(r.ttft_ms > 0 and r.decision_ms < (timeout_s + 0.25) * 1e3 for r in served + dead + back)


def test_unreachable_tracking_store_then_ready_once_it_answers(trained_store, tmp_path):
    store_port = free_port()
    with serve_process(tracking_uri=f"http://127.0.0.1:{store_port}", poll_interval_s=0.3) as (url, proc):
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and "failed" in ready.json()["reason"]
        assert httpx.get(f"{url}/livez").status_code == 200
        with mlflow_server(trained_store, str(tmp_path / "artifacts"), port=store_port):
            assert wait_until(lambda: is_ready(url), seconds=60)
        assert proc.poll() is None  # the same process, never restarted


def test_missing_alias_then_corrupt_artifact_then_ready_without_restart(tmp_path, small_dataset, monkeypatch):
    from mlflow import MlflowClient

    from training.train import train

    uri = sqlite_store(tmp_path / "faults.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    train(small_dataset, **quick())
    client = MlflowClient(tracking_uri=uri)
    client.delete_registered_model_alias(MODEL_NAME, "champion")
    stored = Path(client.get_model_version_download_uri(MODEL_NAME, "1").removeprefix("file://"))
    model_file = next(stored.rglob("*.lgb"))  # one of the recipe's boosters
    good = model_file.read_bytes()

    def reason(url: str) -> str:
        response = httpx.get(f"{url}/readyz")
        return "" if response.status_code == 200 else response.json()["reason"]

    with serve(create_app(Settings(tracking_uri=uri, poll_interval_s=0.2))) as url:
        missing = reason(url)
        assert "champion" in missing  # no alias yet
        model_file.write_text("tree\nnot a model")
        client.set_registered_model_alias(MODEL_NAME, "champion", "1")
        assert wait_until(lambda: reason(url) != missing)
        print(f"\nalias missing: {missing}\ncorrupt artifact: {reason(url)}")
        assert "failed" in reason(url)
        assert httpx.post(f"{url}/v1/chunk-size", json=body(0)).status_code == 503
        model_file.write_bytes(good)
        assert wait_until(lambda: is_ready(url))
        assert httpx.post(f"{url}/v1/chunk-size", json=body(0)).json()["model_version"] == "1"


@pytest.fixture(scope="module")
def predictor(trained_store):
    return load_predictor(trained_store, MODEL_NAME, "champion")


windows = st.one_of(st.none(), st.integers(1, 1 << 20))
shapes = st.builds(
    dict,
    family=st.sampled_from(["llama", "mistral", "qwen2", "gemma3"]),
    num_layers=st.integers(1, 96),
    num_heads=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    kv_divisor=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([16, 32, 64, 128, 256]),
    intermediate_size=st.integers(1, 1 << 16),
    vocab_size=st.integers(2, 1 << 18),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n=st.integers(1, 1 << 20),
    window=windows,
    ring=st.booleans(),
    sinks=st.integers(0, 64),
    model=st.one_of(st.sampled_from(sorted(PRESETS)), shapes),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    threads=st.integers(1, 64),
    attn=st.sampled_from(["masked", "eager"]),
    candidates=st.one_of(st.none(), st.lists(st.integers(1, 1 << 20), min_size=1, max_size=64)),
)
def test_any_valid_request_gets_a_feasible_chunk_and_finite_predictions(
    predictor, n, window, ring, sinks, model, dtype, threads, attn, candidates
):
    if isinstance(model, dict):  # heads divisible by KV heads, as every real model
        shape = dict(model)
        shape["num_kv_heads"] = max(1, shape["num_heads"] // shape.pop("kv_divisor"))
        shape["hidden_size"] = shape["num_heads"] * shape["head_dim"]
        model = shape
    attention = {"window": window, "layout": "ring" if ring and window else "shift", "sinks": sinks if window else 0}
    request = ChunkRequest(
        context_length=n,
        model=model,
        attention=attention,
        dtype=dtype,
        threads=threads,
        attn_impl=attn,
        hardware=HARDWARE,
        candidates=candidates,
    )
    allowed, _ = feasible_chunks(tuple(candidates or DEFAULT_CHUNKS), n, window, attention["layout"])
    if candidates is None:  # the defaults end at the largest chunk the layout takes (a ring's window)
        allowed.append(max_chunk(n, window, attention["layout"]))
    try:
        decision = predictor.answer(request)
    except Infeasible as exc:
        assert not allowed or str(exc).startswith("model."), str(exc)  # nothing feasible, or an impossible shape
        return
    assert decision.chunk_size in allowed
    assert all(0 < c.predicted_ttft_ms < float("inf") for c in [*decision.top, decision.rule])


def test_admin_token_is_compared_in_constant_time(trained_store, monkeypatch):
    import secrets

    calls = []
    real = secrets.compare_digest
    monkeypatch.setattr(secrets, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    with serve(create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, admin_token="t0ken"))) as url:
        assert httpx.post(f"{url}/admin/reload", headers={"authorization": "Bearer t0kem"}).status_code == 401
        assert httpx.post(f"{url}/admin/reload", headers={"authorization": "Bearer t0ken"}).status_code == 200
    assert len(calls) == 2


def test_no_pickle_is_ever_loaded_by_the_service(trained_store):
    """An audit hook turns any unpickling of an object into an error, then the service loads the
    champion, answers over HTTP and reloads; finally the hook itself is shown to fire."""
    code = textwrap.dedent(f"""
        import json, pickle, sys, datetime
        def guard(event, args):
            if event == "pickle.find_class":
                raise RuntimeError(f"unpickling reached: {{args}}")
        sys.addaudithook(guard)
        import httpx
        from servers import serve
        from predictor.app import create_app
        from predictor.settings import Settings
        app = create_app(Settings(tracking_uri={trained_store!r}, poll_interval_s=0, admin_token="t"))
        with serve(app) as url:
            status = httpx.post(url + "/v1/chunk-size", json=json.loads({json.dumps(body(0))!r})).status_code
            reload = httpx.post(url + "/admin/reload", headers={{"authorization": "Bearer t"}}).json()["outcome"]
        try:
            pickle.loads(pickle.dumps(datetime.date(2026, 1, 1)))
            guarded = False
        except RuntimeError:
            guarded = True
        print(json.dumps({{"status": status, "reload": reload, "guarded": guarded}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=TESTS, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "status": 200,
        "reload": "serving version 1",
        "guarded": True,
    }
