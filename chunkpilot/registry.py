"""The registered model: its name and aliases, the promotion gate (the champion's recipe re-measured
on the new run's held-out slices), registering a trained run, and reading a version back for the
service. The one place that knows how a model sits in MLflow; mlflow is imported lazily."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .tracking import quiet_mlflow

MODEL_NAME = "chunk-size-predictor"
CHAMPION, CHALLENGER = "champion", "challenger"
LEGACY = {"rule_margin": 0.0, "rank_with_ranker": False}  # what a recipe logged before these keys existed did
RANKER = "ranker.lgb"  # beside the model: its order within a config combined with the model's levels
HARDWARE = "hardware.json"  # the machines of the training data, by hardware_id
LAST_RETRAIN = "last_retrain"  # registered-model tag: what the latest training did, or why it failed


@dataclass(frozen=True)
class Verdict:
    alias: str  # champion or challenger
    reason: str
    champion_version: str | None  # the champion it was compared with
    champion_regret: float | None


def judge(
    new_regret: float, champion: tuple[str, float] | None, telemetry: tuple[float, float] | None = None
) -> Verdict:
    """`champion` is (version, its mean regret re-measured on this run's slices) or None;
    `telemetry`, (new, champion) mean regret on the engine's recent prefills, when the data has them:
    the challenger must beat the champion on the slices and not lose on those."""
    if champion is None:
        return Verdict(CHAMPION, "no champion yet", None, None)
    version, regret = champion
    same = "on the same held-out slices"
    if telemetry is not None and telemetry[0] > telemetry[1]:
        return Verdict(CHALLENGER, f"mean regret {telemetry[0]:.4f} on this machine's recent prefills is worse than "
                       f"champion v{version}'s {telemetry[1]:.4f}; champion kept", version, regret)  # fmt: skip
    if new_regret < regret:
        return Verdict(
            CHAMPION, f"mean regret {new_regret:.4f} beats champion v{version}'s {regret:.4f} {same}", version, regret
        )
    return Verdict(
        CHALLENGER,
        f"mean regret {new_regret:.4f} does not beat champion v{version}'s {regret:.4f} {same}; champion kept",
        version,
        regret,
    )


def gate(
    client, new: dict[str, float], params: dict, rows: int, remeasure: Callable[[dict], dict[str, float]]
) -> Verdict:
    """The promotion gate: the current champion's recipe scored on this run's slices by `remeasure`
    (mean regret per slice and `all`). Training is deterministic, so the champion's own recipe scores
    the same and is not run again; retrained on more rows (new telemetry, a new profile) it is
    promoted: it has seen more of the machines it serves and cannot do worse on these slices."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except MlflowException:
        return judge(new["all"], None)
    recipe = {**LEGACY, **json.loads(client.get_run(version.run_id).data.params.get("lgbm_params", "{}"))}
    if recipe == params:
        trained = int(client.get_run(version.run_id).data.params.get("rows", 0))
        if rows > trained:
            return Verdict(CHAMPION, f"champion v{version.version}'s recipe retrained on {rows - trained} more rows "
                           f"(held-out mean regret {new['all']:.4f} on these slices either way)",
                           version.version, new["all"])  # fmt: skip
    old = new if recipe == params else remeasure(recipe)
    telemetry = (new["telemetry"], old["telemetry"]) if "telemetry" in new else None
    return judge(new["all"], (version.version, old["all"]), telemetry)


def register(client, version: str, verdict: Verdict, new_regret: float) -> None:
    """Move the verdict's alias to the freshly logged `version` and record why."""
    client.set_registered_model_alias(MODEL_NAME, verdict.alias, version)
    client.set_model_version_tag(MODEL_NAME, version, "mean_regret", f"{new_regret:.6f}")
    client.set_model_version_tag(MODEL_NAME, version, "promotion", verdict.reason)
    record_retrain(client, f"v{version} {verdict.alias}: {verdict.reason}")


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


@dataclass(frozen=True)
class Stored:
    """A registered version as files on this machine plus what its run recorded."""

    version: str
    run_id: str
    model_file: Path  # LightGBM's text format, never a pickle
    ranker_file: Path | None
    hardware: dict
    recipe: dict
    rows: int
    metrics: dict[str, float]


def fetch(tracking_uri: str, name: str = MODEL_NAME, alias: str = CHAMPION) -> Stored:
    """`name@alias` downloaded from the store."""
    import mlflow
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a model load, not a download to watch
    with quiet_mlflow():
        client = MlflowClient(tracking_uri=tracking_uri)
        version = client.get_model_version_by_alias(name, alias)
        mlflow.set_tracking_uri(tracking_uri)
        local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{version.version}"))
        model_files = list(local.glob("*.lgb"))
        if len(model_files) != 1:
            raise ValueError(f"{name} v{version.version} holds no LightGBM text model (*.lgb)")

        def artifact(path: str) -> Path:
            return Path(
                mlflow.artifacts.download_artifacts(
                    run_id=version.run_id, artifact_path=path, tracking_uri=tracking_uri
                )
            )

        run = client.get_run(version.run_id)
        recipe = {**LEGACY, **json.loads(run.data.params.get("lgbm_params", "{}"))}
        return Stored(
            version=str(version.version),
            run_id=version.run_id,
            model_file=model_files[0],
            ranker_file=artifact(RANKER) if recipe["rank_with_ranker"] else None,
            hardware=json.loads(artifact(HARDWARE).read_text()),
            recipe=recipe,
            rows=int(run.data.params.get("rows", 0)),
            metrics={k: v for k, v in run.data.metrics.items() if not math.isnan(v)},
        )
