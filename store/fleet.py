"""The fleet's dataset on one tracking server, so machines need no shared disk.

A partition is one dataset file: a profiled config, or a batch of the engine's prefills. Each
machine's profiler publishes every finished config into its `profiling` run as it goes, and a
service with publish_telemetry set publishes each telemetry batch into its own `telemetry` run: the
file is logged as the artifact `partitions/<hardware id>/<name>.parquet` and only then listed, by a
run tag `partition.<hardware id>/<name>` holding its SHA-256. Training gathers the listed files of
every run, one per (hardware id, name) (the latest run's), each checked against its digest, its
run's spec and machine, and the dataset schema. A process killed mid-upload leaves at most an
unlisted artifact, which nothing reads; a profiler's rerun lists what the killed one did not.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from chunkpilot.paths import UnsafePath, inside
from store.dataset import DataError, read_file

PROFILING_EXPERIMENT, TELEMETRY_EXPERIMENT = "profiling", "telemetry"  # the experiments whose runs publish partitions
PARTITION = "partition."  # tag prefix: partition.<hardware id>/<name> -> SHA-256 of the uploaded file
HARDWARE_TAG, SPEC_TAG = "hardware_id", "spec"  # run tags: which machine (profiling runs), which spec's rows


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def listed(run) -> dict[tuple[str, str], str]:
    """(hardware id, name) -> digest of each partition a run has listed."""
    found = {k[len(PARTITION) :]: v for k, v in run.data.tags.items() if k.startswith(PARTITION)}
    return {tuple(k.split("/", 1)): v for k, v in found.items()}


@dataclass
class Publisher:
    """Publishes dataset files (`<hardware id>/<name>.parquet` on disk) into one run. A failed upload
    is said, never fatal: the file stays on disk (and a profiler's next run publishes it)."""

    client: object  # MlflowClient
    run_id: str

    @classmethod
    def open(cls, uri: str, experiment: str, run_name: str, tags: dict[str, str]) -> Publisher:
        from mlflow import MlflowClient

        from store.tracking import ensure_experiment

        client = MlflowClient(uri)
        run = client.create_run(ensure_experiment(experiment, uri), run_name=run_name, tags=tags)
        return cls(client, run.info.run_id)

    def publish(self, path: Path) -> bool:
        hardware_id, name = path.parent.name, path.stem
        try:
            self.client.log_artifact(self.run_id, str(path), f"partitions/{hardware_id}")
            self.client.set_tag(self.run_id, f"{PARTITION}{hardware_id}/{name}", sha256(path))  # now it is read
        except Exception as exc:  # the server is down, say: the work goes on
            print(f"publishing {path.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return False
        return True

    def catch_up(self, directory: Path, spec: str) -> int:
        """Publish a profiler's finished files in `directory` (one machine's of `spec`) that no run
        has listed: an earlier run was killed, or ran without a server. Returns how many."""
        hardware_id = directory.name
        runs = _runs(self.client, f"tags.{HARDWARE_TAG} = '{hardware_id}' and tags.{SPEC_TAG} = '{spec}'")
        done = {name for run in runs for hw, name in listed(run) if hw == hardware_id}
        return sum(self.publish(p) for p in sorted(Path(directory).glob("*.parquet")) if p.stem not in done)


def _runs(client, filter_string: str = "") -> list:
    """Every run of the publishing experiments matching `filter_string`, oldest first."""
    publishing = map(client.get_experiment_by_name, (PROFILING_EXPERIMENT, TELEMETRY_EXPERIMENT))
    experiments = [e.experiment_id for e in publishing if e]
    runs, token = [], None
    while experiments:
        page = client.search_runs(
            experiments, filter_string, max_results=1000, order_by=["attributes.start_time ASC"], page_token=token
        )
        runs += list(page)
        token = page.token
        if not token:
            break
    return runs


@dataclass
class Gathered:
    root: Path  # <root>/<spec>/<hardware id>/<name>.parquet, as `train --data` reads a folder
    runs: list[str] = field(default_factory=list)  # the runs whose partitions it holds
    profiled: int = 0  # configs
    telemetry: int = 0  # batches of prefills
    downloaded: int = 0  # the others came from the cache
    machines: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # partitions whose tags would write outside `root`


def _fetch(client, run_id: str, artifact: str, digest: str, cache: Path | None, tmp: str) -> tuple[Path | None, bool]:
    """(the listed file, whether it was downloaded): from `cache` (files named by their digest), else
    downloaded and then cached. No file when the download does not match its digest."""
    cached = None if cache is None else cache / f"{digest}.parquet"
    if cached is not None and cached.is_file() and sha256(cached) == digest:
        return cached, False
    path = Path(client.download_artifacts(run_id, artifact, tmp))
    if sha256(path) != digest:
        return None, True
    if cached is not None:  # whole or not at all: a copy beside it (this process's own), then a rename
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f".{digest}-{os.getpid()}.tmp"
        shutil.copyfile(path, partial)
        os.replace(partial, cached)
    return path, True


def gather(client, root: Path, cache: Path | None = None) -> Gathered:
    """Copy every listed partition into `root` (the latest run's copy of each), downloaded unless
    `cache` holds it, each checked against its digest, its run's spec and machine, and the schema.
    A partition whose spec, machine or name is not an identifier is refused and named, never written."""
    latest: dict[tuple[str, str], tuple[object, str]] = {}
    for run in _runs(client):  # oldest first: a later run's copy replaces an earlier one's
        for partition, digest in listed(run).items():
            latest[partition] = (run, digest)
    if not latest:
        raise DataError("data", f"no run on {client.tracking_uri} has published a dataset partition")
    gathered, copied = Gathered(Path(root)), []
    with tempfile.TemporaryDirectory() as tmp:
        for (hardware_id, name), (run, digest) in latest.items():
            run_id, spec = run.info.run_id, run.data.tags.get(SPEC_TAG, PROFILING_EXPERIMENT)
            where = f"run {run_id}, partition {hardware_id}/{name}"
            try:  # tags any writer of the tracking store can set: the copy stays under `root`
                target = inside(gathered.root, spec, hardware_id, name, suffix=".parquet")
            except UnsafePath as exc:
                gathered.refused.append(f"{where}: {exc.message}")
                continue
            artifact = f"partitions/{hardware_id}/{name}.parquet"
            path, downloaded = _fetch(client, run_id, artifact, digest, cache, tmp)
            if path is None:
                fix = f"delete the run's tag {PARTITION}{hardware_id}/{name} and rerun that profile to publish it anew"
                raise DataError("data", f"{where}: the file does not match the digest it was listed with ({fix})")
            rows = read_file(path)  # the schema, row by row
            if set(rows.hardware_id) != {hardware_id} or set(rows.spec_name) != {spec}:
                raise DataError("data", f"{where}: rows of another machine or spec than its run lists")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            gathered.downloaded += downloaded
            copied.append((hardware_id, run))
    gathered.runs = list(dict.fromkeys(run.info.run_id for _, run in copied))
    gathered.telemetry = sum(run.data.tags.get(SPEC_TAG) == TELEMETRY_EXPERIMENT for _, run in copied)
    gathered.profiled = len(copied) - gathered.telemetry
    gathered.machines = sorted({hardware_id for hardware_id, _ in copied})
    return gathered
