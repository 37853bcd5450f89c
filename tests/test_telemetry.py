"""Telemetry: the engine reports each `auto` prefill without waiting, the service checks every
outcome against the contract and appends the accepted ones to a size-capped partition in the
dataset format, and training reads that partition back as measurements."""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime

import httpx
import pytest
from conftest import sqlite_store
from servers import free_port, serve

from auto.client import AutoPolicy, ask
from auto.telemetry import Reporter, to_service
from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks
from chunkpilot.contract import AttentionConfig, ChunkRequest, Hardware, Outcome
from chunkpilot.correction import CLIP
from engine.workload import Workload
from predictor.app import create_app
from predictor.settings import Settings
from store.dataset import Partition, read_dataset
from training.data import load_table, merge_telemetry

HARDWARE = Hardware(
    hardware_id="telemetry-test", matmul_gflops=250.0, bandwidth_gbs=40.0, call_overhead_ms=0.9, cores=2
)


def outcome(**change) -> dict:
    """A valid outcome: 1000 tokens in chunks of 256 (4 chunks)."""
    request = ChunkRequest(context_length=1000, model="llama-tiny", hardware=HARDWARE)
    base = dict(
        request=request.model_dump(mode="json"),
        chunk_size=256,
        source="service",
        model_version="1",
        tokenize_ms=1.0,
        prefill_ms=40.0,
        first_decode_ms=2.0,
        ttft_ms=43.5,
        chunk_ms=[9.0, 9.5, 10.0, 10.5],
        finished_at=datetime.now(UTC).isoformat(),
    )
    return {**base, **change}


@pytest.fixture()
def service(trained_store, tmp_path):
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path / "telemetry"))
    with serve(app) as url:
        yield url, tmp_path / "telemetry"


def test_auto_prefills_land_in_the_partition_as_dataset_rows(service, engines):
    url, partition = service
    engine = engines("llama-tiny")
    policy = AutoPolicy(url, 2.0, HARDWARE, reporter=Reporter(to_service(url), interval_s=0.05))
    text = engine.text(Workload(1500))
    cut = [Workload(n, AttentionConfig(w), text=text) for n, w in ((1500, None), (900, 256), (400, None))]
    runs = [engine.run(w, policy) for w in cut]
    policy.close()  # flushes the queue
    assert policy.reporter.sent == 3 and policy.reporter.dropped == 0
    rows = read_dataset(partition).sort_values("context_length")
    assert rows.hardware_id.unique().tolist() == ["telemetry-test"] and (partition / "telemetry-test").is_dir()
    assert rows.context_length.tolist() == [400, 900, 1500]
    for run, row in zip(sorted(runs, key=lambda r: r.context_length), rows.itertuples(), strict=True):
        assert (row.chunk_size, row.ttft_ms, list(row.chunk_ms)) == (run.chunk_size, run.ttft_ms, run.chunk_ms)
        assert row.decision_source == run.decision.source and row.spec_name == "telemetry"
    metrics = httpx.get(f"{url}/metrics").text
    assert 'chunkpilot_outcomes_total{result="accepted"} 3.0' in metrics


def test_the_service_learns_this_machine_from_each_outcome_without_a_retrain(trained_store, known_machine, tmp_path):
    """Accepted outcomes move the served predictions at once (the per-chunk correction); a restarted
    service learns the same again from the outcomes kept in its telemetry."""
    ask = ChunkRequest(context_length=1000, model="llama-tiny", hardware=known_machine, candidates=[256, 512])
    asked = ask.model_copy(update={"candidates": None}).model_dump(mode="json")
    settings = Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path)

    def predicted(url: str) -> dict[int, float]:
        answer = httpx.post(f"{url}/v1/chunk-size", json=ask.model_dump(mode="json")).json()
        return {c["chunk_size"]: c["predicted_ttft_ms"] for c in answer["top"]}

    with serve(create_app(settings)) as url:
        before = predicted(url)
        # 256s measured slow (and above the plausibility floor of the profiled machine's own measurement)
        slow = [outcome(request=asked, chunk_ms=[999.0] * 4, prefill_ms=4000.0, ttft_ms=4003.5) for _ in range(10)]
        assert httpx.post(f"{url}/v1/feedback", json={"outcomes": slow}).json()["accepted"] == 10
        after = predicted(url)  # not a cached answer: the correction changed it
        assert httpx.get(f"{url}/v1/model").json()["learnt_from_prefills"] == 10
    # moved towards what was measured, by at most the correction's clip (chunkpilot/correction.py)
    assert math.exp(CLIP) >= after[256] / before[256] > after[512] / before[512] > 1
    with serve(create_app(settings)) as url:  # a restart: the correction rebuilt from the partition
        assert predicted(url) == pytest.approx(after)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"chunk_size": -4}, "chunk_size"),
        ({"ttft_ms": 1e9}, "ttft_ms"),  # absurd
        ({"ttft_ms": 20.0}, "ttft_ms"),  # less than its own parts
        ({"chunk_ms": [30.0, 30.0, 30.0, 30.0]}, "chunk_ms"),  # the chunks outlast the prefill
        ({"chunk_ms": [10.0, 10.0]}, "chunk_ms"),  # 1000 tokens in 256s are 4 chunks
        ({"request": {**outcome()["request"], "hardware": {"hardware_id": "who"}}}, "hardware"),
        ({"source": "guess"}, "source"),
        ({"surprise": 1}, "other"),
    ],
)
def test_bad_outcomes_are_refused_by_the_field_they_break(service, change, reason):
    """...and counted by it; a field the contract does not have is `other` (labels from a fixed set)."""
    url, partition = service
    answer = httpx.post(f"{url}/v1/feedback", json={"outcomes": [outcome(), outcome(**change)]})
    assert answer.status_code == 200 and answer.json() == {"accepted": 1, "rejected": {reason: 1}}
    assert len(read_dataset(partition)) == 1  # the good one kept
    assert f'chunkpilot_outcome_rejections_total{{reason="{reason}"}} 1.0' in httpx.get(f"{url}/metrics").text


def test_beyond_loopback_feedback_needs_the_token(trained_store, tmp_path):
    open_app = create_app(
        Settings(tracking_uri=trained_store, poll_interval_s=0, host="0.0.0.0", telemetry_dir=tmp_path)
    )
    with serve(open_app) as url:
        assert httpx.post(f"{url}/v1/feedback", json={"outcomes": [outcome()]}).status_code == 403
    guarded = create_app(
        Settings(tracking_uri=trained_store, poll_interval_s=0, host="0.0.0.0", admin_token="t", telemetry_dir=tmp_path)
    )
    with serve(guarded) as url:
        assert httpx.post(f"{url}/v1/feedback", json={"outcomes": [outcome()]}).status_code == 401
        ok = httpx.post(f"{url}/v1/feedback", json={"outcomes": [outcome()]}, headers={"authorization": "Bearer t"})
        assert ok.json()["accepted"] == 1


def test_service_down_outcomes_are_dropped_and_counted_never_the_prefill(engines):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    engine = engines("llama-tiny")
    policy = AutoPolicy(url, 0.05, HARDWARE, reporter=Reporter(to_service(url, timeout_s=0.2), interval_s=0.05))
    result = engine.run(Workload(300), policy)
    policy.close()
    assert result.decision.source == "fallback" and result.ttft_ms > 0
    assert (policy.reporter.sent, policy.reporter.dropped) == (0, 1)
    assert "Connection refused" in policy.reporter.last_error


def test_a_burst_stays_within_the_queue_and_the_disk_cap(tmp_path):
    release = threading.Event()
    reporter = Reporter(lambda batch: release.wait(10), capacity=100, batch=10)  # a stalled delivery
    queued = sum(reporter.report(outcome()) for _ in range(10_000))
    assert queued <= 100 + 10 and reporter.dropped == 10_000 - queued  # the rest dropped at once, counted
    release.set()
    reporter.close()
    assert reporter.sent == queued

    from chunkpilot.contract import Outcome

    partition = Partition(tmp_path / "telemetry", max_bytes=2**16)
    batch = [Outcome.model_validate(outcome()) for _ in range(50)]
    for _ in range(40):
        written = partition.append(batch)
    files = list((tmp_path / "telemetry").rglob("*.parquet"))
    assert written[0] in files and sum(f.stat().st_size for f in files) <= 2**16  # oldest removed first


def test_training_reads_repeated_prefills_as_one_measurement_per_size(tmp_path):
    """...and a config seen at one size only is kept for its level but never judged."""
    from chunkpilot.contract import Outcome
    from judge.slices import make_slices

    partition = Partition(tmp_path / "telemetry")
    fast = [Outcome.model_validate(outcome(ttft_ms=t, prefill_ms=t - 4)) for t in (43.5, 45.0, 44.0)]
    slow = [Outcome.model_validate(outcome(chunk_size=500, chunk_ms=[30.0, 30.0], ttft_ms=70.0, prefill_ms=66.0))]
    lonely = [
        Outcome.model_validate(outcome(request={**outcome()["request"], "context_length": 2000}, chunk_ms=[5.0] * 8))
    ]
    partition.append(fast + slow + lonely)
    rows = merge_telemetry(read_dataset(tmp_path / "telemetry")).sort_values(["context_length", "chunk_size"])
    assert rows[["context_length", "chunk_size", "repeats", "ttft_ms"]].values.tolist() == [
        [1000, 256, 3, 44.0],
        [1000, 500, 1, 70.0],
        [2000, 256, 1, 43.5],
    ]  # medians; fmt: skip
    table = load_table(tmp_path / "telemetry")
    lonely_group = table.configs.group[table.configs.context_length == 2000].item()
    tested = {g for folds in make_slices(table.configs).values() for _, test in folds for g in test}
    assert lonely_group in set(table.rows.group) and lonely_group not in tested


def test_training_describes_a_profiled_machine_s_telemetry_by_its_profile_as_the_service_does(small_dataset, tmp_path):
    """The engine's own cached descriptors (here a machine read at two thirds of its GFLOP/s, as a
    measurement beside other work reads it) never reach training for a machine profiled at that
    dtype and threads: the service prices such a request by the profile (resolve_hardware), so
    training sees those features; a machine never profiled keeps its own."""
    import shutil

    data = tmp_path / "ttft"
    shutil.copytree(small_dataset, data)
    profiled = read_dataset(data).iloc[0]
    slow = Hardware(
        hardware_id=profiled.hardware_id, matmul_gflops=profiled.matmul_gflops / 1.5,
        bandwidth_gbs=profiled.bandwidth_gbs / 1.5, call_overhead_ms=profiled.call_overhead_ms * 1.5, cores=2,
    )  # fmt: skip
    request = ChunkRequest(
        context_length=1000, model="llama-tiny", hardware=slow, threads=int(profiled.threads), dtype=profiled["dtype"]
    )
    unknown = request.model_copy(update={"hardware": HARDWARE})
    partition = Partition(data / "telemetry")
    # slow enough for any machine's plausibility floor (the profile's descriptors, measured in this session)
    timed = {"chunk_ms": [300.0] * 4, "prefill_ms": 1200.0, "ttft_ms": 1203.0}
    partition.append(
        [Outcome.model_validate(outcome(request=r.model_dump(mode="json"), **timed)) for r in (request, unknown)]
    )
    rows = load_table(data).rows
    mine = rows[(rows.hardware_id == profiled.hardware_id) & (rows.threads == profiled.threads)]
    mine = mine[mine["dtype"] == profiled["dtype"]]
    seen = mine.spec_name == "telemetry"
    assert seen.sum() == 1
    for column in ("matmul_gflops", "bandwidth_gbs", "call_overhead_ms"):
        assert mine[seen][column].item() == pytest.approx(mine[~seen][column].median())
    assert rows[rows.hardware_id == HARDWARE.hardware_id].matmul_gflops.item() == HARDWARE.matmul_gflops


def answer_with_runner_up(best_ms: float, other_ms: float, sd: float = 0.2):
    """An answer whose runner-up is predicted `other_ms`, the members' spread of the gap `sd` (log ms)."""
    import math

    from chunkpilot.contract import Anchor, Candidate, Decision
    from estimator.decide import Gain, attach_gains, expected_gain

    top = [Candidate(chunk_size=512, predicted_ttft_ms=best_ms), Candidate(chunk_size=768, predicted_ttft_ms=other_ms)]
    gain = expected_gain(math.log(other_ms / best_ms), sd)
    anchor = Anchor(**top[1].model_dump(), name="fixed 768", spec="768")
    answer = Decision(
        chunk_size=512,
        predicted_ttft_ms=best_ms,
        top=top,
        rule=top[1],
        anchor=anchor,
        model_version="1",
        source="model",
    )
    return attach_gains(answer, (Gain(768, other_ms / best_ms, gain),))


def test_exploration_stays_within_its_budget_and_only_where_measuring_is_expected_to_gain():
    from predictor.explore import Explorer

    explorer = Explorer(budget=0.01)
    answers = [explorer.explore(answer_with_runner_up(100.0, 105.0)) for _ in range(1000)]
    explored = [a for a in answers if a.explored]
    assert 0 < len(explored) < 1000 and all(a.chunk_size == 768 for a in explored)
    assert explorer.spent_ms == pytest.approx(5.0 * len(explored)) and explorer.spent_share <= 0.01  # the budget holds
    sure = Explorer(budget=0.5)  # the members agree the runner-up is 50% slower: nothing to gain
    assert not any(sure.explore(answer_with_runner_up(100.0, 150.0, sd=0.02)).explored for _ in range(100))
    off = Explorer(budget=0.0)
    assert not any(off.explore(answer_with_runner_up(100.0, 100.5)).explored for _ in range(100))


def test_exploring_spends_on_the_largest_expected_gain_not_the_runner_up():
    from chunkpilot.contract import Anchor, Candidate, Decision
    from estimator.decide import Gain, attach_gains
    from predictor.explore import Explorer

    sizes = [Candidate(chunk_size=c, predicted_ttft_ms=ms) for c, ms in ((512, 100.0), (768, 101.0), (256, 110.0))]
    # the runner-up (768) is 1% slower but the members agree; 256 is 10% slower but they disagree widely
    anchor = Anchor(**sizes[0].model_dump(), name="hand rule", spec="rule")
    response = Decision(
        chunk_size=512,
        predicted_ttft_ms=100.0,
        top=sizes,
        rule=sizes[0],
        anchor=anchor,
        model_version="1",
        source="model",
    )
    answer = attach_gains(response, (Gain(768, 1.01, 0.003), Gain(256, 1.1, 0.04)))
    assert Explorer(budget=0.5).explore(answer).chunk_size == 256


def test_exploring_measures_a_waiting_challenger_s_pick_within_the_same_budget():
    from predictor.explore import Explorer

    explorer = Explorer(budget=0.05)
    # the model is sure (a 30% gap), but a challenger picks the other size: worth measuring, if affordable
    answers = [explorer.explore(answer_with_runner_up(100.0, 130.0, sd=0.02), shadow=768) for _ in range(200)]
    explored = [a for a in answers if a.explored]
    assert 0 < len(explored) < 200 and all(a.chunk_size == 768 for a in explored)
    assert explorer.spent_share <= 0.05
    agreeing = Explorer(budget=0.5)  # a challenger that agrees (or picks outside the top) changes nothing
    sure = answer_with_runner_up(100.0, 130.0, sd=0.02)
    assert not any(agreeing.explore(sure, shadow=s).explored for s in (512, 64))


def test_explored_answers_are_marked_counted_and_never_cached_by_the_engine(trained_store, tmp_path, monkeypatch):
    from engine.machine import fingerprint

    # where the champion is unsure by more than MIN_GAIN depends on what the harness measured on this
    # machine (on some, nowhere among these requests): here any expected gain is worth a prefill
    monkeypatch.setattr("predictor.explore.MIN_GAIN", 0.0)
    # the machine the champion was profiled on: the model decides (a machine it never saw gets the anchor)
    known = HARDWARE.model_copy(update={"hardware_id": fingerprint()["hardware_id"]})
    requests = [
        ChunkRequest(context_length=n, model="llama-tiny", attention=attention, hardware=known)
        for n in (300, 700, 1500, 3000, 6000, 12000)
        for attention in ({"window": None}, {"window": 128}, {"window": 256, "layout": "ring"})
    ]

    def settings(budget: float) -> Settings:
        return Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path, explore_budget=budget)

    def answers(url: str) -> list[dict]:
        return [httpx.post(f"{url}/v1/chunk-size", json=r.model_dump(mode="json")).json() for r in requests]

    with serve(create_app(settings(0.0))) as url:
        picks = answers(url)
    with serve(create_app(settings(0.5))) as url:  # generous: exploring whenever the model is unsure
        given = answers(url)
        metrics = httpx.get(f"{url}/metrics").text
        again = answers(url)  # never twice running for the same request: this time the picks are measured
        unsure = next(r for r, a in zip(requests, given, strict=True) if a["explored"])
        policy = AutoPolicy(url, 2.0, known)
        decisions = [policy.decide(unsure) for _ in range(3)]
        policy.close()
    assert not any(p["explored"] for p in picks)
    explored = [(p, a) for p, a in zip(picks, given, strict=True) if a["explored"]]
    assert all(a["chunk_size"] != p["chunk_size"] for p, a in explored)  # another candidate than the pick
    assert f"chunkpilot_explored_total {float(len(explored))}" in metrics
    assert 0 < float(metrics.split("\nchunkpilot_explore_spent_share ")[1].split()[0]) <= 0.5
    assert all(a["chunk_size"] == p["chunk_size"] for p, a, g in zip(picks, again, given, strict=True) if g["explored"])
    # an explored answer is for its prefill only: the engine asks again, and caches only the pick
    assert [(d.source, d.explored) for d in decisions] == [("service", True), ("service", False), ("cache", False)]


def test_the_gate_keeps_a_champion_the_challenger_loses_to_on_recent_prefills():
    from training.promotion import judge

    assert judge(0.02, ("3", 0.05), telemetry=(0.01, 0.02)).alias == "champion"
    kept = judge(0.02, ("3", 0.05), telemetry=(0.04, 0.02))  # better on the slices, worse on this machine
    assert kept.alias == "challenger" and "recent prefills" in kept.reason


def test_retrain_learns_from_measured_telemetry_and_says_what_it_did(small_dataset, tmp_path, engines, monkeypatch):
    """A retrain on telemetry makes a challenger, not a champion; the next retrain judges it against
    the champion on the prefills that came after it (which neither has seen) and says so. A config
    profiled meanwhile is promoted at once, with only the champion's telemetry, while the newer
    telemetry waits in the challenger."""
    import shutil

    from conftest import QUICK_ARGS, train_into_store
    from mlflow import MlflowClient

    from auto.telemetry import outcome as as_outcome
    from cli import main
    from engine.policy import FixedPolicy
    from store.registry import LAST_RETRAIN, MODEL_NAME

    root = tmp_path / "data"
    shutil.copytree(small_dataset, root / "profiled")
    later = sorted((root / "profiled").rglob("*.parquet"))[-1]  # a config profiled after v2: kept aside
    later.rename(tmp_path / later.name)
    uri = train_into_store(root / "profiled", tmp_path)  # v1, trained without telemetry
    engine = engines("llama-tiny")
    text = engine.text(Workload(700))

    def prefills(configs, every_size: bool = False) -> None:  # as the engine reports them
        outcomes = []
        for n, window in configs:
            request = ask(engine.request(n, AttentionConfig(window=window)), HARDWARE)
            sizes = feasible_chunks(DEFAULT_CHUNKS, n, window, "shift")[0] if every_size else [128, 256] * 2
            for chunk in sizes:
                result = engine.run(Workload(n, AttentionConfig(window), text=text), FixedPolicy(chunk))
                outcomes.append(Outcome.model_validate({**as_outcome(request, result), "source": "service"}))
        Partition(root / "telemetry").append(outcomes)

    prefills([(700, None), (500, 128)])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["retrain", "--data", str(root), *QUICK_ARGS]) == 0  # train_into_store's recipe
    client = MlflowClient(tracking_uri=uri)

    def retrained() -> str:
        return client.get_registered_model(MODEL_NAME).tags[LAST_RETRAIN]

    def alias(name: str) -> str:
        return str(client.get_model_version_by_alias(MODEL_NAME, name).version)

    v2 = client.get_model_version(MODEL_NAME, "2")
    slices = json.loads(client.get_run(v2.run_id).data.params["slices"])
    assert slices["telemetry"] == 1  # the engine's own prefills judged as a slice of their own
    assert "mean_regret.telemetry" in client.get_run(v2.run_id).data.metrics
    assert {"ttft", "telemetry"} <= {d.dataset.name for d in client.get_run(v2.run_id).inputs.dataset_inputs}
    assert retrained().startswith("v2 challenger: champion v1's recipe retrained on 8 more prefills"), retrained()
    assert (alias("champion"), alias("challenger")) == ("1", "2")  # v1 keeps serving meanwhile
    exploring = Settings(tracking_uri=uri, poll_interval_s=0, telemetry_dir=tmp_path / "t", explore_budget=0.5)
    with serve(create_app(exploring)) as url:  # the service measures the waiting challenger's picks
        assert httpx.get(f"{url}/readyz").json()["challenger"] == "2"

    prefills([(600, None), (400, 128), (650, 256)], every_size=True)  # after v2: seen by neither v1 nor v2
    (tmp_path / later.name).rename(later)  # and a config profiled meanwhile
    assert main(["retrain", "--data", str(root), *QUICK_ARGS]) == 0
    said = retrained()
    judged = said.split("(before it: ")[1].split("; v3 ")[0]  # what settle said, before v3's registration
    assert "on 3 configs of prefills neither had seen" in judged, judged
    promoted = judged.startswith("challenger v2 promoted")
    assert promoted or judged.startswith("challenger v2 not promoted")
    theirs, ours = (float(x.split()[0]) for x in judged.split("mean regret ")[1].split("'s "))
    assert promoted == (theirs < ours)
    # the new config serves now (v3: the profiled rows with the champion's own telemetry only), the
    # new telemetry waits (v4, judged against v3 on the prefills after it)
    held = "8" if promoted else "0"
    assert f"v3 champion: champion v{2 if promoted else 1}'s recipe retrained on " in said, said
    assert f"more profiled rows with only the {held} prefills of telemetry it had" in said
    assert said.startswith("v4 challenger: champion v3's recipe retrained on "), said
    assert (alias("champion"), alias("challenger")) == ("3", "4")
    params = [client.get_run(client.get_model_version(MODEL_NAME, v).run_id).data.params for v in ("3", "4")]
    assert params[0]["telemetry_prefills"] == held and int(params[1]["telemetry_prefills"]) > 8
    assert params[0]["profiled_rows"] == params[1]["profiled_rows"]
    assert "Not held out on its own" in client.get_model_version(MODEL_NAME, "3").description

    assert main(["retrain", "--data", str(tmp_path / "nothing")]) == 2  # a failed retrain: champion kept
    assert retrained().startswith("failed: DataError")
    assert alias("champion") == "3"  # still serving
    app = create_app(Settings(tracking_uri=uri, poll_interval_s=0, telemetry_dir=tmp_path / "t"))
    with serve(app) as url:
        assert httpx.get(f"{url}/readyz").json()["last_retrain"].startswith("failed: DataError")


def test_a_waiting_challenger_is_promoted_only_when_strictly_better_on_enough_unseen_prefills(tmp_path):
    """promotion.settle's rule with a fake judge (a unit test: the comparison itself is the test
    above): a real store holding a champion and a challenger that learnt from telemetry."""
    from mlflow import MlflowClient

    from store import registry
    from training import promotion

    client = MlflowClient(tracking_uri=sqlite_store(tmp_path / "mlflow.db"))
    client.create_registered_model(registry.MODEL_NAME)
    for features in ("a,b", "a,b", "a,b,c"):  # the third: trained on the features of another version
        run = client.create_run(client.create_experiment(f"e{features}{len(client.search_experiments())}"))
        client.log_param(run.info.run_id, "features", features)
        client.create_model_version(registry.MODEL_NAME, source=str(tmp_path), run_id=run.info.run_id)
    client.set_registered_model_alias(registry.MODEL_NAME, registry.CHAMPION, "1")
    client.set_registered_model_alias(registry.MODEL_NAME, registry.CHALLENGER, "2")

    def settle(judge):
        return promotion.settle(client, judge, {"features": "a,b"})

    assert settle(lambda *_: (0.0, 0.1, 9)) is None  # not a telemetry challenger: never
    client.set_model_version_tag(registry.MODEL_NAME, "2", registry.WAITS, "true")
    asked = []

    def judge(regrets: tuple[float, float, int]):
        return lambda *args: asked.append(args) or regrets

    assert "not judged yet: 2 configs" in settle(judge((0.01, 0.03, 2)))
    assert "not promoted" in settle(judge((0.03, 0.03, 5)))  # a tie keeps the champion
    assert (
        asked[0][:2] == ("2", "1")
        and asked[0][2] == client.get_model_version(registry.MODEL_NAME, "2").creation_timestamp
    )
    assert settle(judge((0.01, 0.03, 5))).startswith("challenger v2 promoted: mean regret 0.0100")
    assert str(client.get_model_version_by_alias(registry.MODEL_NAME, registry.CHAMPION).version) == "2"
    assert settle(judge((0.0, 0.1, 9))) is None  # nothing waits any more
    client.set_registered_model_alias(registry.MODEL_NAME, registry.CHALLENGER, "3")
    client.set_model_version_tag(registry.MODEL_NAME, "3", registry.WAITS, "true")
    assert settle(judge((0.0, 0.1, 9))) is None  # other features: not this version's to judge


def test_a_service_killed_mid_append_leaves_every_file_readable(trained_store, tmp_path):
    """kill -9 while batches are being appended: each file is whole or absent (written aside,
    renamed into place), so the next reader reads every file and a whole number of batches."""
    import os
    import random
    import signal
    import time

    from servers import answers, serve_process, wait_until

    partition = tmp_path / "telemetry"
    body = {"outcomes": [outcome() for _ in range(200)]}
    with serve_process(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=partition) as (url, proc):
        assert wait_until(lambda: answers(f"{url}/readyz"), seconds=60)

        def blast() -> None:
            while True:
                try:
                    httpx.post(f"{url}/v1/feedback", json=body, timeout=10)
                except httpx.HTTPError:
                    return  # the service is gone

        senders = [threading.Thread(target=blast, daemon=True) for _ in range(2)]
        for sender in senders:
            sender.start()
        assert wait_until(lambda: any(partition.rglob("batch-*.parquet")), seconds=30)
        time.sleep(random.uniform(0.0, 0.5))
        os.kill(proc.pid, signal.SIGKILL)
        for sender in senders:
            sender.join(timeout=20)
    rows = read_dataset(partition)  # would raise on a torn file; stray temporaries are skipped
    assert len(rows) >= 200 and len(rows) % 200 == 0
