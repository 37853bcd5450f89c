"""The project's MLflow defaults: a SQLite store with artifacts under ./mlruns, unless
MLFLOW_TRACKING_URI says otherwise (a real `mlflow server`, say). mlflow is imported lazily:
it costs seconds."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MLRUNS = Path("mlruns")
# MLflow draws a progress bar for every artifact download (each champion load): noise in a log
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(MLRUNS / 'mlflow.db').resolve()}"


@contextmanager
def quiet_mlflow() -> Iterator[None]:
    """mlflow 3.17 warns from inside its own code under pandas 3 and SQLAlchemy 2 (deprecations
    only it can fix, and a schema hint about integer columns): nothing a caller can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="mlflow")
        warnings.filterwarnings("ignore", module="pandas")  # raised on mlflow's behalf
        yield


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """The id of experiment `name` in the store at `uri` (default: tracking_uri()), created if
    missing; a second process creating it at the same moment (two profilers) is fine."""
    from mlflow import MlflowClient, MlflowException

    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        MLRUNS.mkdir(exist_ok=True)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        # the default store keeps artifacts beside it, under mlruns/; a tracking server decides
        location = (MLRUNS / "artifacts" / name).resolve().as_uri() if uri.startswith("sqlite:") else None
        try:
            client.create_experiment(name, artifact_location=location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id


def log_input(dataset, context: str, attempts: int = 3) -> None:
    """`mlflow.log_input` on the active run. The SQL store checks for the dataset, then inserts it:
    two processes logging the same new dataset at once (two retrains) collide on its unique key,
    and the loser's retry finds it there and only links it to its run."""
    import mlflow
    from mlflow import MlflowException

    for attempt in range(attempts):
        try:
            mlflow.log_input(dataset, context=context)
            return
        except MlflowException as exc:
            if "unique constraint" not in str(exc).lower() or attempt == attempts - 1:
                raise


def use_experiment(name: str) -> str:
    """Point mlflow at the store and select (creating if needed) the experiment; returns its id."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    experiment_id = ensure_experiment(name)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id
