"""A fleet on one tracking server (a real `mlflow server` on PostgreSQL, artifacts served by it):
every machine's profiler publishes each finished config as it goes, one `train --from-tracking`
trains on all of them, and a profiler killed at any moment leaves nothing half-written that
training would read. Machines are told apart by their fingerprint: a profiler pinned to one core
is a one-core machine to it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICK_ARGS
from servers import mlflow_server, postgres, wait_until
from test_profiler import TINY, write_spec

from profiler.spec import Spec
from store.dataset import DataError, read_dataset
from store.fleet import PARTITION, PROFILING_EXPERIMENT, gather, listed
from store.registry import CHAMPION, MODEL_NAME

SPEC = {**TINY, "name": "fleet", "repeats": 1}  # 4 configs a machine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One tracking server for the module's fleet: PostgreSQL backend, artifacts on local disk."""
    root = tmp_path_factory.mktemp("fleet-server")
    with postgres(root / "pg") as backend, mlflow_server(backend, str(root / "artifacts")) as url:
        yield url


def chunkpilot(url: str, *args: str, cwd: Path, cores: set[int] | None = None) -> subprocess.Popen:
    """A `chunkpilot` process against the server, pinned to `cores` if given (its own session, so
    a kill takes its measuring worker too)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": url, "PYTHONUNBUFFERED": "1"}
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env=env,
        preexec_fn=pin,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def runs_of(url: str, spec: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(url)
    experiment = client.get_experiment_by_name(PROFILING_EXPERIMENT)
    return client.search_runs([experiment.experiment_id], f"tags.spec = '{spec}'") if experiment else []


def test_two_machines_profile_at_once_and_one_training_sees_both(server, tmp_path):
    from mlflow import MlflowClient

    from store.registry import fetch

    machines = {"one-core": {0}, "whole": None}  # two fingerprints: cores 1 and 2
    for name in machines:
        (tmp_path / name).mkdir()
    profilers = {
        name: chunkpilot(server, "profile", "--spec", str(write_spec(tmp_path, SPEC)), cwd=tmp_path / name, cores=cores)
        for name, cores in machines.items()
    }
    for proc in profilers.values():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output
    local = {name: read_dataset(tmp_path / name / "data" / "ttft" / "fleet") for name in machines}
    ids = {name: rows.hardware_id.iloc[0] for name, rows in local.items()}
    assert len(set(ids.values())) == 2  # different machines, as the fingerprint sees them
    runs = runs_of(server, "fleet")
    assert sorted(run.data.tags["hardware_id"] for run in runs) == sorted(ids.values())
    for run in runs:  # each run lists every config its machine finished
        machine = next(n for n, i in ids.items() if i == run.data.tags["hardware_id"])
        assert set(listed(run)) == {(ids[machine], key) for key in local[machine].config_key}

    trainer = chunkpilot(server, "train", "--from-tracking", *QUICK_ARGS, cwd=tmp_path)
    output, _ = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, output
    assert "gathered 8 configs and 0 telemetry batches of 2 machines" in output
    version = MlflowClient(server).get_model_version_by_alias(MODEL_NAME, CHAMPION)
    model_run = MlflowClient(server).get_run(version.run_id)
    assert int(model_run.data.params["rows"]) == sum(len(rows) for rows in local.values())
    with fetch(server, version=version.version) as stored:
        assert set(stored.hardware) == set(ids.values())  # both machines' descriptors


def test_a_killed_profiler_leaves_nothing_half_written_that_training_reads(server, tmp_path):
    """SIGKILL at random moments just after a config is written (before, during or after its
    upload): whatever is listed downloads whole and validates, an unlisted upload is never read,
    and the rerun publishes what the killed runs did not list, each config once."""
    from mlflow import MlflowClient

    spec = {**SPEC, "name": "killed", "sweeps": [{**SPEC["sweeps"][0], "contexts": [24, 40, 56, 72]}]}
    path = write_spec(tmp_path, spec)
    folder = tmp_path / "data" / "ttft" / "killed"
    moments = random.Random(11)

    def finished() -> int:
        return sum(1 for f in folder.rglob("*.parquet") if not f.name.startswith(".tmp-"))

    for _ in range(2):
        before = finished()
        proc = chunkpilot(server, "profile", "--spec", str(path), cwd=tmp_path)
        wait_until(lambda b=before, p=proc: finished() > b or p.poll() is not None, seconds=300, every=0.01)
        time.sleep(moments.uniform(0, 0.3))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    client = MlflowClient(server)
    if any(listed(r) for r in runs_of(server, "killed")):  # every listed partition: whole, its machine's, valid
        gathered = gather(client, tmp_path / "gathered")
        assert {p.stem for p in (gathered.root / "killed").rglob("*.parquet")} == {
            key for r in runs_of(server, "killed") for _, key in listed(r)
        }

    # what a kill between an upload and its listing leaves: an artifact no tag lists, cut short
    run = runs_of(server, "killed")[0]
    hardware_id = run.data.tags["hardware_id"]
    cut = tmp_path / "killed-n999-unlisted.parquet"
    cut.write_bytes(next(folder.rglob("*.parquet")).read_bytes()[:100])
    client.log_artifact(run.info.run_id, str(cut), f"partitions/{hardware_id}")
    proc = chunkpilot(server, "profile", "--spec", str(path), cwd=tmp_path)  # the rerun finishes the sweep
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    runs = runs_of(server, "killed")
    published = [key for r in runs for _, key in listed(r)]
    assert sorted(published) == sorted(c.key for c in Spec.from_dict(spec).configs)  # every config, each once
    again = gather(client, tmp_path / "again")
    assert not list(again.root.rglob("*unlisted*"))

    # a listed file that is not what was listed is refused, named (in the run whose copy training takes)
    owner = max((r for r in runs if (hardware_id, published[0]) in listed(r)), key=lambda r: r.info.start_time)
    client.log_artifact(
        owner.info.run_id, str(cut.rename(cut.with_name(f"{published[0]}.parquet"))), f"partitions/{hardware_id}"
    )
    client.set_tag(owner.info.run_id, f"{PARTITION}{hardware_id}/{published[0]}", "0" * 64)
    with pytest.raises(DataError, match=f"partition {hardware_id}/{published[0]}: the file does not match"):
        gather(client, tmp_path / "refused")
    client.delete_tag(owner.info.run_id, f"{PARTITION}{hardware_id}/{published[0]}")  # the fix the error names
    proc = chunkpilot(server, "profile", "--spec", str(path), cwd=tmp_path)
    assert proc.communicate(timeout=600) and proc.returncode == 0
    assert (hardware_id, published[0]) in listed(max(runs_of(server, "killed"), key=lambda r: r.info.start_time))
    gather(client, tmp_path / "mended")


def test_a_replicas_telemetry_is_published_for_training(server, tmp_path):
    """A service with publish_telemetry set publishes each telemetry file into its `telemetry` run,
    off the request path; training gathers it where it reads telemetry, row for row."""
    import httpx
    from mlflow import MlflowClient
    from servers import serve
    from test_telemetry import outcome

    from predictor.app import create_app
    from predictor.settings import Settings

    settings = Settings(
        tracking_uri=server, poll_interval_s=0, telemetry_dir=tmp_path / "telemetry", publish_telemetry=True
    )
    client = MlflowClient(server)

    def published() -> int:
        experiment = client.get_experiment_by_name("telemetry")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        return sum(len(listed(run)) for run in runs)

    with serve(create_app(settings)) as url:
        body = {"outcomes": [outcome(chunk_size=256), outcome(chunk_size=512, chunk_ms=[20.0, 21.0])]}
        assert httpx.post(f"{url}/v1/feedback", json=body).json()["accepted"] == 2
        assert wait_until(lambda: published() == 1, seconds=30)
    gathered = gather(client, tmp_path / "gathered", tmp_path / "cache")
    assert gathered.telemetry == 1 and gathered.downloaded == gathered.telemetry + gathered.profiled
    again = gather(client, tmp_path / "again", tmp_path / "cache")  # what the cache holds is not downloaded again
    assert again.downloaded == 0 and sorted(p.name for p in again.root.rglob("*.parquet")) == sorted(
        p.name for p in gathered.root.rglob("*.parquet")
    )
    fleet, local = (
        read_dataset(root).sort_values("chunk_size") for root in (gathered.root / "telemetry", tmp_path / "telemetry")
    )
    assert fleet.ttft_ms.tolist() == local.ttft_ms.tolist() and fleet.config_key.tolist() == local.config_key.tolist()
