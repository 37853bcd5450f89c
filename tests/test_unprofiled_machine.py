"""`auto` on a machine the model never saw: the engine measures its descriptors into the user's
cache and sends them, so the model decides (over HTTP and in-process), from any working folder;
a fallback always says why; a promoted model replaces the engine's cached answers in bounded time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from conftest import quick, sqlite_store, train_into_store
from servers import free_port, serve, wait_until

from auto.client import AutoPolicy
from chunkpilot.contract import PRESETS, AttentionConfig, ChunkRequest, Hardware
from predictor.app import create_app
from predictor.settings import Settings


@pytest.fixture(scope="module")
def foreign_store(small_dataset, tmp_path_factory):
    """A champion trained on the small dataset relabelled as another machine's, so that this
    machine's hardware_id is one the model never saw."""
    from store.dataset import read_dataset, write_config

    root = tmp_path_factory.mktemp("foreign")
    rows = read_dataset(small_dataset).assign(hardware_id="another-machine")
    for key, config in rows.groupby("config_key"):
        write_config(root / "ttft", key, config.reset_index(drop=True))
    return train_into_store(root / "ttft", root)


def prefill_auto(tmp_path, uri: str, *extra: str) -> tuple[dict, str]:
    """`chunkpilot prefill --chunk-size auto` in a fresh process, from a folder that is not the
    repo, with an empty per-user cache. Returns (its JSON report, its stderr)."""
    work = tmp_path / "elsewhere"
    work.mkdir(exist_ok=True)
    env = {**os.environ, "CHUNKPILOT_CACHE_DIR": str(tmp_path / "cache"), "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "prefill",
            "--model",
            "llama-tiny",
            "--context-length",
            "300",
            "--window",
            "64",
            "--kv-layout",
            "ring",
            "--threads",
            "2",
            "--repeats",
            "1",
            "--chunk-size",
            "auto",
            "--predictor-timeout-ms",
            "2000",
            "--json",
            *extra,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_unseen_machine_gets_service_then_in_process_decisions_from_any_folder(tmp_path, foreign_store):
    with serve(create_app(Settings(tracking_uri=foreign_store, poll_interval_s=0))) as url:
        report, err = prefill_auto(tmp_path, foreign_store, "--predictor-url", url)
    sources = [r["decision"]["source"] for r in report["repeats"]]
    assert sources == ["cache"] and report["decision"]["model_version"] == "1"  # the warm-up asked the service
    assert report["decision"]["reason"] is None and "fell back" not in err
    assert "measuring this machine" in err  # the empty cache was filled once...
    cached = list((tmp_path / "cache" / "hardware").glob("*.json"))
    assert len(cached) == 1 and "float32/2" in json.loads(cached[0].read_text())
    report, again = prefill_auto(tmp_path, foreign_store, "--in-process")
    assert "measuring this machine" not in again  # ...and reused
    assert report["decision"]["source"] == "in-process" and report["decision"]["model_version"] == "1", again


def test_a_fallback_says_why_once_on_stderr_and_in_the_json(tmp_path, foreign_store):
    port = free_port()  # nothing listens there
    report, err = prefill_auto(tmp_path, foreign_store, "--predictor-url", f"http://127.0.0.1:{port}")
    assert report["decision"]["source"] == "fallback" and f"127.0.0.1:{port}" in report["decision"]["reason"]
    # a service it never reached said no anchor: the engine's own default answers, and it says so once
    assert err.count("auto fell back to default (the engine's default)") == 1
    assert "default (the engine's default) answered" in report["decision"]["reason"]


def test_the_service_counts_refusals_by_reason(foreign_store):
    with serve(create_app(Settings(tracking_uri=foreign_store, poll_interval_s=0))) as url:
        unknown = httpx.post(
            f"{url}/v1/chunk-size",
            json={"context_length": 100, "model": "llama-tiny", "hardware": {"hardware_id": "never-seen"}},
        )
        invalid = httpx.post(
            f"{url}/v1/chunk-size", json={"context_length": 0, "model": "llama-tiny", "hardware": {"hardware_id": "x"}}
        )
        metrics = httpx.get(f"{url}/metrics").text
    assert unknown.status_code == 422 and "was not profiled" in unknown.json()["detail"]
    assert invalid.status_code == 422
    assert 'chunkpilot_rejections_total{reason="unknown_hardware"} 1.0' in metrics
    assert 'chunkpilot_rejections_total{reason="invalid_request"} 1.0' in metrics


def test_a_promoted_model_replaces_cached_answers_within_poll_plus_ttl(tmp_path, small_dataset, monkeypatch):
    from mlflow import MlflowClient

    from store.registry import MODEL_NAME
    from training.train import train

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri := sqlite_store(tmp_path / "mlflow.db"))
    monkeypatch.chdir(tmp_path)
    train(small_dataset, **quick())
    hardware = {"matmul_gflops": 250.0, "bandwidth_gbs": 40.0, "call_overhead_ms": 0.9, "cores": 2}
    request = ChunkRequest(
        3000, PRESETS["llama-tiny"], AttentionConfig(512, "ring"), "float32", 2, "masked", hardware=hardware
    )
    poll_s, ttl_s = 0.3, 0.5
    with serve(create_app(Settings(tracking_uri=uri, poll_interval_s=poll_s))) as url:
        policy = AutoPolicy(url, 2.0, Hardware(**hardware), cache_ttl_s=ttl_s)
        assert policy.decide(request).model_version == "1"
        assert policy.decide(request).source == "cache"
        train(small_dataset, **quick(learning_rate=0.3, num_leaves=7))  # v2, whatever the gate said
        MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", "2")
        promoted = time.monotonic()
        assert wait_until(lambda: policy.decide(request).model_version == "2", seconds=20, every=0.05)
        waited = time.monotonic() - promoted
        policy.close()
    assert waited < poll_s + ttl_s + 5.0  # the bound (a stale answer's refresh), plus a model load's (about 2 s)
