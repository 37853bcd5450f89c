"""The attack suite: what a client on loopback (no token, as the README starts the service) or any
writer of the tracking store tries, and that each attempt fails with nothing lost. One test per
way in: paths out of the telemetry folder, outcomes that would steer the model, bad files at
start-up and at polls, a batch that would stall the loop, labels that grow /metrics, a race in
the correction, two promoters at once, tags that move a gathered file, a token the engine must
send, a Host that is not ours, and SIGTERM in the middle of a batch. Latencies go to the test
log (`pytest -s`); no test asserts a wall-clock time."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import QUICK_ARGS, ROOT, sqlite_store
from servers import serve, serve_process, wait_until
from test_telemetry import HARDWARE, outcome

from auto.telemetry import Reporter, to_service
from chunkpilot.contract import ChunkRequest, ConfigError, Hardware
from chunkpilot.correction import CLIP, PRIOR, Correction
from chunkpilot.features import FEATURES
from chunkpilot.paths import UnsafePath, inside
from chunkpilot.plausibility import implausible
from predictor.app import create_app
from predictor.settings import Settings
from store.dataset import Partition, read_dataset, read_file, write_config
from store.registry import CHALLENGER, CHAMPION, MODEL_NAME
from training import promotion


def files_under(*roots: Path) -> set[Path]:
    return {p for root in roots for p in Path(root).rglob("*") if p.is_file()}


def with_hardware_id(hardware_id: str) -> dict:
    request = outcome()["request"]
    return outcome(request={**request, "hardware": {**request["hardware"], "hardware_id": hardware_id}})


def test_a_hardware_id_that_is_a_path_writes_nothing_anywhere(trained_store, tmp_path):
    """An absolute path or `..` as the machine's id once made the service write a Parquet file there."""
    telemetry, outside = tmp_path / "root" / "telemetry", tmp_path / "outside"
    outside.mkdir()
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=telemetry))
    attacks = [str(outside / "abs"), "../../../outside/dotdot", "a/b", "..", ".hidden", "x" * 65]
    with serve(app) as url:
        answer = httpx.post(f"{url}/v1/feedback", json={"outcomes": [with_hardware_id(h) for h in attacks]})
        metrics = httpx.get(f"{url}/metrics").text
    assert answer.json() == {"accepted": 0, "rejected": {"hardware_id": len(attacks)}}
    assert f'chunkpilot_outcome_rejections_total{{reason="hardware_id"}} {len(attacks)}.0' in metrics
    assert files_under(tmp_path) == set()  # nothing written, inside the root or out of it


def test_paths_from_outside_stay_inside_their_root_even_through_a_link(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert inside(tmp_path / "root", "m-1", "batch", suffix=".parquet") == tmp_path / "root" / "m-1" / "batch.parquet"
    for parts in [("..",), ("/etc",), ("a/b",), ("link", "x")]:
        with pytest.raises(UnsafePath):
            inside(tmp_path / "root", *parts)
    with pytest.raises(ConfigError, match="hardware_id"):
        Hardware(hardware_id="../x")


def test_the_partition_refuses_an_unsafe_folder_even_when_the_contract_was_bypassed(tmp_path):
    """Defence in depth: an Outcome built without validation (model_construct) still cannot escape."""
    from chunkpilot.contract import Outcome

    good = Outcome.model_validate(outcome())
    forged_hw = good.request.hardware.model_construct(**{**good.request.hardware.model_dump(), "hardware_id": ".."})
    forged = good.model_copy(update={"request": good.request.model_copy(update={"hardware": forged_hw})})
    with pytest.raises(UnsafePath):
        Partition(tmp_path / "telemetry").append([forged])
    assert files_under(tmp_path) == set()


def ask_all(url: str, request: ChunkRequest) -> dict[int, float]:
    answer = httpx.post(f"{url}/v1/chunk-size", json=request.model_dump(mode="json")).json()
    return {c["chunk_size"]: c["predicted_ttft_ms"] for c in answer["top"]}


def test_poisoned_outcomes_move_any_prediction_by_at_most_the_stated_bound(trained_store, known_machine, tmp_path):
    """An impossible outcome is refused; K plausible lies from one source move every candidate's
    predicted TTFT by at most exp(CLIP * (1 - (PRIOR / (K + PRIOR))**2)), however far they lie."""
    from chunkpilot.chunks import uniform
    from chunkpilot.plausibility import floor_ms
    from estimator.decide import resolve_hardware
    from predictor.model import load_predictor

    telemetry = tmp_path / "telemetry"
    settings = Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=telemetry)
    # a machine the model knows: its own predictions, corrected (a machine it never saw: the anchor's)
    request = ChunkRequest(
        context_length=3000, model="llama-tiny", hardware=known_machine, candidates=[256, 512, 1024, 3000]
    )
    n, c = 3000, 256
    chunks = -(-n // c)
    impossible = outcome(
        request={**request.model_dump(mode="json"), "candidates": None},
        chunk_size=c,
        chunk_ms=[1e-300] * chunks,
        prefill_ms=1.0,
        ttft_ms=4.0,
    )
    k = 60
    # each chunk at the plausibility floor (2x the machine's measured matmul peak): many times faster than real
    profiled = load_predictor(trained_store, MODEL_NAME, CHAMPION, tabled=False).recipe.hardware
    machine = resolve_hardware(profiled, request.hardware, request.dtype, request.threads)
    floor = [1.001 * floor_ms(request.shape, machine, tokens) for tokens in uniform(n, c)]
    lie = dict(impossible, chunk_ms=floor, prefill_ms=sum(floor) + 1, ttft_ms=sum(floor) + 4)
    with serve(create_app(settings)) as url:
        before = ask_all(url, request)
        first = httpx.post(f"{url}/v1/feedback", json={"outcomes": [impossible]}).json()
        assert first == {"accepted": 0, "rejected": {"implausible": 1}}
        assert ask_all(url, request) == before  # refused: taught nothing
        accepted = sum(
            httpx.post(f"{url}/v1/feedback", json={"outcomes": [lie] * 20}).json()["accepted"] for _ in range(k // 20)
        )
        after = ask_all(url, request)
    bound = float(np.exp(CLIP * (1 - (PRIOR / (k + PRIOR)) ** 2)))
    moved = max(max(before[s] / after[s], after[s] / before[s]) for s in before)
    print(f"\n{k} poisoned outcomes moved a predicted TTFT by x{moved:.3f} (bound x{bound:.3f})")
    assert accepted == k and 1.0 < moved <= bound * (1 + 1e-9)


def test_the_server_stamps_when_it_received_an_outcome(trained_store, tmp_path):
    """`finished_at` decides which outcomes judge a challenger: the client's clock has no say."""
    settings = Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path / "t")
    with serve(create_app(settings)) as url:
        sent = time.time()
        forged = outcome(finished_at="2100-01-01T00:00:00+00:00")
        assert httpx.post(f"{url}/v1/feedback", json={"outcomes": [forged]}).json()["accepted"] == 1
    stamped = read_dataset(tmp_path / "t").finished_at.iloc[0].timestamp()
    assert sent - 1 <= stamped <= time.time() + 1


def test_every_shipped_row_is_plausible_on_its_own_machine():
    """The plausibility floor refuses lies, never what the profiler measured (SLACK leaves room)."""
    rows = read_dataset(ROOT / "data" / "ttft")
    rows = rows[rows.chunk_ms.notna()]
    refused = [
        why
        for r in rows.to_dict("records")
        if (why := implausible(ChunkRequest.from_row(r).shape, r, r["context_length"], r["chunk_size"], r["chunk_ms"]))
    ]
    assert len(rows) > 1000 and refused == []


def plant_corrupt_batch(telemetry: Path) -> Path:
    bad = telemetry / "telemetry-test" / "batch-1-1.parquet"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(np.random.default_rng(0).bytes(300))
    return bad


def test_a_corrupt_telemetry_file_is_skipped_counted_and_named_at_start_up_and_reload(trained_store, tmp_path):
    telemetry = tmp_path / "telemetry"
    from chunkpilot.contract import Outcome

    Partition(telemetry).append([Outcome.model_validate(outcome())])
    bad = plant_corrupt_batch(telemetry)
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=telemetry))
    with serve(app) as url:
        ready = httpx.get(f"{url}/readyz").json()
        assert ready["ready"] and any(s.startswith(bad.name) for s in ready["skipped_telemetry"])
        assert httpx.get(f"{url}/v1/model").json()["learnt_from_prefills"] == 1  # the good file still taught
        assert "chunkpilot_telemetry_skipped_total 1.0" in httpx.get(f"{url}/metrics").text
        state = app.state.service
        assert state.load(force=True).startswith("serving version")  # a reload meets the same file
        assert httpx.get(f"{url}/readyz").json()["ready"]


def test_polls_compare_the_alias_before_downloading_and_leave_no_files(trained_store, tmp_path, monkeypatch):
    downloads = tmp_path / "tmp"
    downloads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(downloads))  # where MLflow and we download to
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path / "t"))
    state = app.state.service
    assert state.load().startswith("serving version")
    import predictor.service

    fetched = []
    real = predictor.service.load_predictor
    monkeypatch.setattr(predictor.service, "load_predictor", lambda *a: fetched.append(a) or real(*a))
    for _ in range(3):
        assert state.load().endswith("already serving")
    assert fetched == []  # the alias's version was compared first: nothing downloaded
    assert state.load(force=True).startswith("serving version") and len(fetched) == 1
    assert files_under(downloads) == set()  # what was downloaded is gone once loaded


def heaviest_batch(hardware: dict) -> dict:
    """The largest batch the contract allows, at its largest candidate list, on long contexts, on a
    machine the model knows (where it does not, the anchor answers each from a feature row)."""
    sizes = sorted({int(2 ** (6 + i * 11 / 63)) for i in range(64)} | {200_000})[-64:]
    request = {"model": "llama-tiny", "hardware": hardware, "candidates": sizes}
    return {"requests": [dict(request, context_length=200_000 - i) for i in range(256)]}


def test_livez_answers_while_the_heaviest_batch_is_decided(trained_store, known_machine, tmp_path):
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path))
    with serve(app) as url:
        result: dict = {}
        heaviest = heaviest_batch(known_machine)
        batch = threading.Thread(
            target=lambda: result.update(r=httpx.post(f"{url}/v1/chunk-size/batch", json=heaviest, timeout=120))
        )
        latencies = []
        with httpx.Client(base_url=url) as client:
            client.get("/livez")
            batch.start()
            time.sleep(0.05)
            while batch.is_alive():
                t0 = time.perf_counter()
                assert client.get("/livez").status_code == 200
                latencies.append((time.perf_counter() - t0) * 1e3)
                time.sleep(0.01)
        batch.join()
    assert result["r"].status_code == 200 and len(result["r"].json()["responses"]) == 256
    print(
        f"\n/livez during the heaviest batch: {len(latencies)} probes, median {statistics.median(latencies):.1f} ms,"
        f" worst {max(latencies):.1f} ms"
    )
    assert len(latencies) >= 5  # answered again and again while the batch was decided (on the loop: once or twice)


def test_metric_labels_come_from_a_fixed_set(trained_store, tmp_path):
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path))
    with serve(app) as url:
        for size in (1001, 1003, 1005):
            body = {
                "context_length": 5000,
                "model": "llama-tiny",
                "hardware": HARDWARE.model_dump(),
                "candidates": [size],
            }
            assert httpx.post(f"{url}/v1/chunk-size", json=body).status_code == 200
        odd = [outcome(**{f"key{i}": 1}) for i in range(5)]
        answer = httpx.post(f"{url}/v1/feedback", json={"outcomes": odd}).json()
        metrics = httpx.get(f"{url}/metrics").text
    assert answer["accepted"] == 0 and sum(answer["rejected"].values()) == 5
    labels = {value for _, value in re.findall(r'(\w+)="([^"]*)"', metrics)}  # every label value
    assert 'chunk_size="other"' in metrics and not labels & {"1001", "1003", "1005"}
    assert 'reason="other"' in metrics and not any("key0" in value for value in labels)


def test_the_correction_is_safe_under_concurrent_learn_and_decide():
    """The service learns in its thread pool while other threads decide: every learn adds keys."""
    correction, errors, stop = Correction(), [], threading.Event()
    rng = np.random.default_rng(0)
    layers = FEATURES.index("num_layers")
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads far more often than the default 5 ms

    def learn() -> None:
        for i in range(1000):
            config = np.zeros((4, len(FEATURES)))
            config[:, layers] = i  # a new kind of request each time: the dicts grow under the reader
            correction.learn(config, rng.integers(1, 5000, 4).astype(float), rng.normal(0, 0.5, 4))
        stop.set()

    def read() -> None:
        x = np.zeros((12, len(FEATURES)))
        while not stop.is_set():
            try:
                correction.noise()
                correction.difference_variance(x)
            except RuntimeError as exc:  # "dictionary changed size during iteration"
                errors.append(exc)
                return

    threads = [threading.Thread(target=learn), threading.Thread(target=read)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert errors == [] and correction.prefills == 1000


def test_two_concurrent_retrains_keep_both_aliases_consistent(small_dataset, tmp_path):
    """Both retrains reach the gate while the test holds the store's promotion lock; released, they
    judge one after the other, the second against the champion the first registered."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    command = [sys.executable, "-m", "cli", "retrain", "--data", str(small_dataset), *QUICK_ARGS]
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    lines: list[list[str]] = [[], []]
    with promotion.one_promoter(uri):
        runs = [subprocess.Popen(command, cwd=tmp_path, env=env, **output) for _ in range(2)]
        readers = [threading.Thread(target=out.extend, args=(p.stdout,)) for p, out in zip(runs, lines, strict=True)]
        for reader in readers:
            reader.start()
        waiting = wait_until(lambda: all(any("waiting for another promotion" in x for x in out) for out in lines), 600)
        assert waiting, lines  # both trained, and both wait at the gate
    for p, reader in zip(runs, readers, strict=True):
        assert p.wait(timeout=600) == 0, lines
        reader.join()
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    versions = sorted(client.search_model_versions(f"name='{MODEL_NAME}'"), key=lambda v: int(v.version))
    reasons = [v.tags["promotion"] for v in versions]
    assert len(versions) == 2 and reasons[0] == "no champion yet", reasons
    assert "v1" in reasons[1]  # judged against the first: the lock made them take turns
    champion = str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version)
    aliases = {str(v.version): client.get_model_version(MODEL_NAME, v.version).aliases for v in versions}
    assert champion in ("1", "2") and sum(CHAMPION in a for a in aliases.values()) == 1
    if champion == "1":
        assert str(client.get_model_version_by_alias(MODEL_NAME, CHALLENGER).version) == "2"


def test_register_refuses_when_the_champion_moved_since_judging(tmp_path):
    """A promoter on another machine (no shared lock) moved the champion: no alias is moved."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    client.create_registered_model(MODEL_NAME)
    for _ in range(2):
        client.create_model_version(MODEL_NAME, "file:///nowhere")
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, "1")
    stale = promotion.Verdict(CHAMPION, "no champion yet", None, None)  # judged before v1 became champion
    with pytest.raises(promotion.AliasMoved, match="champion is v1"):
        promotion.register(client, "2", stale, 0.01)
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"
    assert "no alias moved" in client.get_model_version(MODEL_NAME, "2").tags["promotion"]


def test_gather_writes_only_under_the_folder_it_is_given(tmp_path, monkeypatch):
    """A run tag names the spec, and so a folder: one that is a path is refused, never followed."""
    from mlflow import MlflowClient

    from store.fleet import PROFILING_EXPERIMENT, SPEC_TAG, Publisher, gather

    uri = sqlite_store(tmp_path / "mlflow.db")
    shipped = next((ROOT / "data" / "ttft" / "cpu-shipped").rglob("*.parquet"))
    rows = read_file(shipped).assign(spec_name="../../outside", hardware_id="m-1")  # rows agreeing with the tags
    partition = write_config(tmp_path / "staged" / "m-1", "config-1", rows)
    monkeypatch.chdir(tmp_path)  # the experiment's artifacts land in tmp_path/mlruns
    publisher = Publisher.open(uri, PROFILING_EXPERIMENT, "forged", {SPEC_TAG: "../../outside", "hardware_id": "m-1"})
    assert publisher.publish(partition)
    gathered = gather(MlflowClient(uri), tmp_path / "a" / "b" / "root")
    assert len(gathered.refused) == 1 and "not an identifier" in gathered.refused[0]
    assert not (tmp_path / "a" / "outside").exists() and not (tmp_path / "a" / "b" / "root").exists()


def test_the_engine_sends_the_token_a_guarded_service_needs(trained_store, tmp_path, monkeypatch):
    settings = Settings(tracking_uri=trained_store, poll_interval_s=0, admin_token="s3cret", telemetry_dir=tmp_path)
    with serve(create_app(settings)) as url:
        monkeypatch.setenv("CHUNKPILOT_ADMIN_TOKEN", "s3cret")
        reporter = Reporter(to_service(url), interval_s=0.05)
        reporter.report(outcome())
        reporter.close()
    assert (reporter.sent, reporter.dropped) == (1, 0) and len(read_dataset(tmp_path)) == 1


def test_a_host_that_is_not_ours_is_refused(trained_store, tmp_path):
    """A page that rebinds its own name to 127.0.0.1 reaches no route; configured names do."""
    settings = Settings(
        tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path, allowed_hosts=["predictor.lan"]
    )
    with serve(create_app(settings)) as url:
        port = url.rsplit(":", 1)[1]
        evil = httpx.get(f"{url}/readyz", headers={"host": f"attacker.example:{port}"})
        named = httpx.get(f"{url}/readyz", headers={"host": f"predictor.lan:{port}"})
        plain = httpx.get(f"{url}/readyz")
        metrics = httpx.get(f"{url}/metrics").text
    assert evil.status_code == 400 and "attacker.example" in evil.json()["detail"]
    assert named.status_code == 200 and plain.status_code == 200
    assert 'chunkpilot_rejections_total{reason="host"} 1.0' in metrics


def test_sigterm_turns_readiness_off_then_answers_every_in_flight_request(trained_store, known_machine, tmp_path):
    telemetry = tmp_path / "telemetry"
    batch = {"requests": heaviest_batch(known_machine)["requests"][:128]}
    with serve_process(tracking_uri=trained_store, telemetry_dir=telemetry, drain_delay_s=1.5, drain_timeout_s=60) as (
        url,
        proc,
    ):
        assert wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, seconds=60)
        answers: list = []

        def post(path: str, body: dict) -> None:
            try:
                answers.append(httpx.post(f"{url}{path}", json=body, timeout=120).status_code)
            except httpx.HTTPError as exc:
                answers.append(repr(exc))

        flights = [threading.Thread(target=post, args=("/v1/chunk-size/batch", batch)) for _ in range(3)]
        flights += [threading.Thread(target=post, args=("/v1/feedback", {"outcomes": [outcome()] * 10}))]
        for t in flights:
            t.start()
        time.sleep(0.3)  # all four are in flight
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        draining = httpx.get(f"{url}/readyz")
        for t in flights:
            t.join()
        proc.wait(timeout=90)
    assert draining.status_code == 503 and "shutting down" in draining.json()["reason"]
    assert answers == [200] * 4, answers
    assert len(read_dataset(telemetry)) == 10  # the feedback that was in flight: nothing lost


def test_stateful_feedback_then_decisions_never_fail_and_stay_within_the_bound(trained_store, tmp_path):
    """Hypothesis' stateful testing against a live service: outcomes a client might send (most of them
    consistent, with chunk times around the plausibility floor, some hostile) interleaved with
    decisions. Never a 5xx; every accepted outcome lands in the partition; no prediction ever leaves
    exp(CLIP) of its first answer. Schemathesis' own stateful mode chains routes by OpenAPI links, and
    no answer of this API feeds another's request, so the sequence is Hypothesis' rules here."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

    from chunkpilot.chunks import uniform
    from chunkpilot.plausibility import floor_ms

    telemetry = tmp_path / "telemetry"
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=telemetry))
    tally = {"accepted": 0, "sent": 0}
    first: dict[tuple[str, bool], dict[int, float]] = {}
    requests = st.builds(
        lambda n, model, window: ChunkRequest(
            context_length=n, model=model, attention={"window": window}, hardware=HARDWARE
        ),
        st.integers(64, 3000),
        st.sampled_from(["llama-tiny", "qwen2-gqa"]),
        st.sampled_from([None, 256, 1024]),
    )

    @st.composite
    def outcomes(draw) -> dict:
        request = draw(requests)
        c = draw(st.sampled_from([64, 128, 256, 512, 1024, request.context_length]))
        c = min(c, request.context_length)
        chunk_ms = [
            floor_ms(request.shape, HARDWARE.model_dump(), q) * draw(st.floats(0.5, 30))
            for q in uniform(request.context_length, c)
        ]
        prefill = sum(chunk_ms) * 1.01 + 0.1
        body = outcome(
            request=request.model_dump(mode="json"),
            chunk_size=c,
            chunk_ms=chunk_ms,
            prefill_ms=prefill,
            ttft_ms=prefill + 3.5,
        )
        hostile = draw(st.sampled_from([None, None, None, "path", "count", "field"]))
        if hostile == "path":
            body = {
                **body,
                "request": {**body["request"], "hardware": {**body["request"]["hardware"], "hardware_id": "../x"}},
            }
        elif hostile == "count":
            body = {**body, "chunk_ms": body["chunk_ms"][:-1] or [1.0, 1.0]}
        elif hostile == "field":
            body = {**body, "extra": 1}
        return body

    with serve(app) as url, httpx.Client(base_url=url, timeout=30) as client:

        class FeedbackThenDecide(RuleBasedStateMachine):
            @rule(batch=st.lists(outcomes(), min_size=1, max_size=8))
            def feedback(self, batch: list[dict]) -> None:
                answer = client.post("/v1/feedback", json={"outcomes": batch})
                assert answer.status_code == 200, answer.text
                result = answer.json()
                assert result["accepted"] + sum(result["rejected"].values()) == len(batch)
                tally["accepted"] += result["accepted"]
                tally["sent"] += len(batch)

            @rule(request=requests)
            def decide(self, request: ChunkRequest) -> None:
                answer = client.post("/v1/chunk-size", json=request.model_dump(mode="json"))
                assert answer.status_code in (200, 422), answer.text
                if answer.status_code == 200:
                    predicted = {c["chunk_size"]: c["predicted_ttft_ms"] for c in answer.json()["top"]}
                    # priced by the model, or (a machine it does not know yet) by the analytic estimate
                    by_model = answer.json()["source"] != "anchor"
                    seen = first.setdefault((request.model_dump_json(), by_model), predicted)
                    for size in predicted.keys() & seen.keys():
                        ratio = predicted[size] / seen[size]
                        assert np.exp(-CLIP) * (1 - 1e-9) <= ratio <= np.exp(CLIP) * (1 + 1e-9)

        run_state_machine_as_test(
            FeedbackThenDecide,
            settings=settings(
                max_examples=12, stateful_step_count=8, deadline=None, suppress_health_check=list(HealthCheck)
            ),
        )
    assert len(read_dataset(telemetry)) == tally["accepted"]  # every accepted outcome landed
    print(f"\nstateful run: {tally['accepted']} of {tally['sent']} generated outcomes accepted")
    assert tally["accepted"] > 0 and tally["accepted"] < tally["sent"]
