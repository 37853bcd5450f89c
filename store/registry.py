"""The registered model in MLflow: its name, aliases and tags, what the latest training did, and
reading a version back for the service. The one place that knows how a model sits in MLflow
(which alias a new version gets is training/promotion.py's); mlflow is imported lazily."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from chunkpilot.contract import ChunkRequest
from store.tracking import quiet_mlflow

MODEL_NAME = "chunk-size-predictor"
CHAMPION, CHALLENGER = "champion", "challenger"
RECIPE = "recipe"  # run param: the registered recipe's name and params (estimator.recipe.Recipe.params)
HARDWARE_FILE = "hardware.json"  # the machines of the training data, by hardware_id
LAST_RETRAIN = "last_retrain"  # registered-model tag: what the latest training did, or why it failed
WAITS = "waits_for_telemetry"  # version tag of a challenger that `settle` may promote


def record_retrain(client, outcome: str) -> None:
    """What the latest (re)training did, on the registered model, where the service's /readyz reads it
    (nothing to record on before a first model is registered)."""
    from mlflow.exceptions import MlflowException

    try:
        client.set_registered_model_tag(MODEL_NAME, LAST_RETRAIN, outcome[:500])
    except MlflowException:
        pass


def last_retrain(tracking_uri: str, name: str = MODEL_NAME) -> str | None:
    from mlflow import MlflowClient

    with quiet_mlflow():
        return MlflowClient(tracking_uri=tracking_uri).get_registered_model(name).tags.get(LAST_RETRAIN)


def alias_version(tracking_uri: str, name: str, alias: str) -> str:
    """The version behind `name@alias` (MlflowException when there is none)."""
    from mlflow import MlflowClient

    with quiet_mlflow():
        return str(MlflowClient(tracking_uri=tracking_uri).get_model_version_by_alias(name, alias).version)


@dataclass(frozen=True)
class Stored:
    """A registered version as files on this machine plus what its run recorded."""

    version: str
    run_id: str
    recipe_dir: Path  # estimator.recipe.load_recipe reads it: LightGBM's text format, never a pickle
    hardware: dict
    rows: int
    metrics: dict[str, float]
    waits: bool  # a challenger that learnt from telemetry, waiting for `settle`


@contextmanager
def fetch(
    tracking_uri: str, name: str = MODEL_NAME, alias: str = CHAMPION, version: str | None = None
) -> Iterator[Stored]:
    """`name@alias` (or `version`) downloaded from the store into a temporary folder that is removed
    when the block ends (MLflow's own default folder is never removed: a service polling for days
    would fill its disk); ValueError when it is not a recipe."""
    with tempfile.TemporaryDirectory(prefix="chunkpilot-model-") as dst:
        yield _download(tracking_uri, Path(dst), name, alias, version)


def _download(tracking_uri: str, dst: Path, name: str, alias: str, version: str | None) -> Stored:
    import mlflow
    from mlflow import MlflowClient

    with quiet_mlflow():
        client = MlflowClient(tracking_uri=tracking_uri)
        version = client.get_model_version(name, version) if version else client.get_model_version_by_alias(name, alias)
        mlflow.set_tracking_uri(tracking_uri)
        local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{version.version}", dst_path=str(dst)))
        found = sorted(local.glob(f"**/{RECIPE}/recipe.json"))
        if not found:
            raise ValueError(
                f"{name} v{version.version} holds no recipe: registered by an older ChunkPilot, "
                "retrain it (chunkpilot train)"
            )
        hardware = mlflow.artifacts.download_artifacts(
            run_id=version.run_id, artifact_path=HARDWARE_FILE, tracking_uri=tracking_uri, dst_path=str(dst)
        )
        run = client.get_run(version.run_id)
        return Stored(
            version=str(version.version),
            run_id=version.run_id,
            recipe_dir=found[0].parent,
            hardware=json.loads(Path(hardware).read_text()),
            rows=int(run.data.params.get("rows", 0)),
            metrics={k: v for k, v in run.data.metrics.items() if not math.isnan(v)},
            waits=version.tags.get(WAITS) == "true",
        )


def model_signature():
    """The MLflow model's signature: one request per row, the service's request fields as columns
    (their values checked by the contract, so any type passes MLflow's own check), one decision per row."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, Schema

    from estimator.decide import ROW  # numpy and LightGBM: only when a model is logged

    inputs = [ColSpec(AnyType(), name, required=f.is_required()) for name, f in ChunkRequest.model_fields.items()]
    outputs = [ColSpec(kind, name) for name, kind in ROW.items()]
    return ModelSignature(Schema(inputs), Schema(outputs))
