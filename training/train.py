"""`chunkpilot train`: cross-validate the model and every baseline on the held-out slices, log each
as its own MLflow run with the same metric names, then log and register the model trained on all
data, moving `champion` only through the promotion gate."""

from __future__ import annotations

import copy
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from chunkpilot import registry
from chunkpilot.cache import user_cache_dir
from chunkpilot.dataset import LISTS, DataError
from chunkpilot.features import FEATURES
from chunkpilot.fleet import Gathered, gather
from chunkpilot.registry import Verdict
from chunkpilot.tracking import quiet_mlflow, tracking_uri, use_experiment

from . import plots
from .chunk_cost import PerChunkCost
from .data import Table, load_table
from .evaluate import cross_validate, flat, on_recent_telemetry, slice_metrics
from .policies import DEFAULT_PARAMS, TTFTRegressor, baselines, variants
from .search import search, slice_regrets
from .slices import make_slices


@dataclass
class TrainResult:
    metrics: dict[str, dict[str, dict[str, float]]]  # policy -> slice -> metric
    version: str
    verdict: Verdict
    settled: str | None  # what the gate did to a waiting challenger first
    seconds: float
    rows: int
    configs: int


def hardware_table(rows: pd.DataFrame) -> dict:
    """Each machine in the data: its fingerprint and its descriptors per "dtype/threads". Logged
    with the model, so the service can resolve a request's hardware_id (predictor/model.py)."""
    static = ["device_kind", "device_name", "cores", "l2_cache_bytes", "l3_cache_bytes", "memory_bytes"]
    measured = ["matmul_gflops", "bandwidth_gbs", "call_overhead_ms"]
    return {
        str(hardware_id): {
            "static": json.loads(machine[static].iloc[0].to_json()),
            "descriptors": {
                f"{dtype}/{threads}": json.loads(g[measured].median().to_json())
                for (dtype, threads), g in machine.groupby(["dtype", "threads"])
            },
        }
        for hardware_id, machine in rows.groupby("hardware_id")
    }


def _log_dataset(table: Table, source: str) -> None:
    import mlflow

    lineage = table.rows.drop(columns=LISTS)
    mlflow.log_input(mlflow.data.from_pandas(lineage, source=str(source), name="ttft"), context="training")
    telemetry = lineage[lineage.spec_name == "telemetry"]
    if len(telemetry):  # the engine's own prefills, their own input: the compare view shows how they grow
        mlflow.log_input(mlflow.data.from_pandas(telemetry, source=str(source), name="telemetry"), context="training")


def _row_counts(table: Table) -> tuple[int, int]:
    """(profiled rows, telemetry prefills): what the gate weighs differently."""
    telemetry = table.rows.spec_name == "telemetry"
    return int((~telemetry).sum()), int(table.rows.repeats[telemetry].sum())


def fit_chunk_cost(table: Table, params: dict) -> PerChunkCost | None:
    """The per-chunk cost model on every config with per-chunk times (dataset v2 and telemetry),
    served beside the model to choose schedules; None when no row has them."""
    timed = table.rows.group[table.rows.chunk_ms.notna()].unique()
    if len(timed) == 0:
        return None
    model = PerChunkCost(params)
    model.fit(table.subset(timed))
    return model


def _log_model(
    final: TTFTRegressor,
    chunk_cost: PerChunkCost | None,
    table: Table,
    source: str,
    params: dict,
    slices: dict,
    trials: list[dict],
    frames: dict[str, pd.DataFrame],
    predictions: pd.DataFrame,
    verdict: Verdict,
) -> str:
    """Inside the model's run: its recipe, held-out metrics, artifacts and figures; the booster
    logged and registered. Returns the registered version."""
    import mlflow

    mlflow.set_tags(
        {
            "role": "model",
            "policy": "lgbm-regressor",
            "promotion": verdict.reason,
            "target": "log(ttft_ms) - chunkpilot.features.base_log_ms(features)",
        }
    )
    mlflow.log_params(
        {
            "lgbm_params": json.dumps(params, sort_keys=True),
            "features": ",".join(FEATURES),
            "rows": len(table.rows),
            **dict(zip(("profiled_rows", "telemetry_prefills"), _row_counts(table), strict=True)),
            "configs": table.rows.group.nunique(),
            "slices": json.dumps({k: len(v) for k, v in slices.items()}),
            "chunk_cost": str(chunk_cost is not None).lower(),
        }
    )
    booster = final.booster
    importance = dict(zip(FEATURES, booster.feature_importance("gain").round(1).tolist(), strict=True))
    mlflow.log_dict(dict(sorted(importance.items(), key=lambda kv: -kv[1])), "feature_importance.json")
    mlflow.log_dict(hardware_table(table.rows), registry.HARDWARE)
    if final.ranker is not None:
        mlflow.log_text(final.ranker.model.booster_.model_to_string(), registry.RANKER)
    if chunk_cost is not None:
        mlflow.log_text(chunk_cost.booster.model_to_string(), registry.CHUNK_COST)
    if trials:
        mlflow.log_dict({"trials": trials}, "search_trials.json")
    for figure, name in (
        (plots.regret_cdf(frames), "regret_cdf.png"),
        (plots.predicted_vs_measured(predictions), "predicted_vs_measured.png"),
        (plots.best_chunk_heatmap(table.rows), "best_chunk_heatmap.png"),
    ):
        mlflow.log_figure(figure, name)
        plots.plt.close(figure)
    _log_dataset(table, source)
    example = pd.DataFrame(table.x[:3], columns=list(FEATURES))
    signature = mlflow.models.infer_signature(example, booster.predict(table.x[:3]))
    info = mlflow.lightgbm.log_model(
        booster, name="model", signature=signature, input_example=example, registered_model_name=registry.MODEL_NAME
    )
    return str(info.registered_model_version)


def train(
    data: Path,
    experiment: str = "chunk-size",
    params: dict | None = None,
    search_minutes: float = 0.0,
    source: str | None = None,
) -> TrainResult:
    """Cross-validate every baseline and variant and the model on the same slices, each its own run;
    then fit on all rows, pass the gate, log and register. `source`: where the data came from, for
    the runs' lineage (default: the `data` folder)."""
    source = source or str(data)
    import mlflow
    from mlflow import MlflowClient

    start = time.monotonic()
    params = {**DEFAULT_PARAMS, **(params or {})}
    table = load_table(data)
    slices = make_slices(table.configs)
    if not slices:
        raise DataError("data", f"{data}: the configs differ in nothing that can be held out")
    trials: list[dict] = []
    if search_minutes > 0:
        params, trials = search(params, table, slices, search_minutes)
    metrics: dict[str, dict] = {}
    frames: dict[str, pd.DataFrame] = {}
    with quiet_mlflow():
        experiment_id = use_experiment(experiment)
        client = MlflowClient()
        others = [(b, "baseline") for b in baselines()] + [(v, "variant") for v in variants(params, table.rows)]
        for policy, role in others:
            frame, _ = cross_validate(lambda p=policy: copy.copy(p), table, slices)
            frames[policy.name], metrics[policy.name] = frame, slice_metrics(frame)
            with mlflow.start_run(experiment_id=experiment_id, run_name=policy.name):
                mlflow.set_tags({"role": role, "policy": policy.name})
                mlflow.log_metrics(flat(metrics[policy.name]))
                _log_dataset(table, source)

        frame, predictions = cross_validate(lambda: TTFTRegressor(params), table, slices)
        frames["lgbm-regressor"], metrics["lgbm-regressor"] = frame, slice_metrics(frame)
        new = {name: m["mean_regret"] for name, m in metrics["lgbm-regressor"].items()}
        new_regret = new["all"]
        final = TTFTRegressor(params)
        final.fit(table)
        settled = registry.settle(client, on_recent_telemetry(data, tracking_uri()), ",".join(FEATURES))
        chunk_cost = fit_chunk_cost(table, params)
        verdict = registry.gate(
            client,
            new,
            params,
            _row_counts(table),
            lambda recipe: slice_regrets(recipe, table, slices),
            ",".join(FEATURES),
            chunk_cost is not None,
        )
        with mlflow.start_run(experiment_id=experiment_id, run_name="lgbm-regressor"):
            mlflow.log_metrics(flat(metrics["lgbm-regressor"]))
            version = _log_model(final, chunk_cost, table, source, params, slices, trials, frames, predictions, verdict)
        registry.register(client, version, verdict, new_regret, settled)
    return TrainResult(
        metrics, version, verdict, settled, time.monotonic() - start, len(table.rows), table.rows.group.nunique()
    )


def train_from_tracking(
    experiment: str = "chunk-size", params: dict | None = None, search_minutes: float = 0.0
) -> tuple[Gathered, TrainResult]:
    """`train` on every partition the fleet published to the tracking server (chunkpilot/fleet.py):
    each machine's profiled configs and the services' telemetry batches."""
    from mlflow import MlflowClient

    uri = tracking_uri()
    with tempfile.TemporaryDirectory(prefix="chunkpilot-fleet-") as tmp:
        with quiet_mlflow():
            gathered = gather(MlflowClient(uri), Path(tmp) / "ttft", user_cache_dir() / "partitions")
        source = f"{uri} ({len(gathered.runs)} publishing runs)"
        return gathered, train(gathered.root, experiment, params, search_minutes, source)


def train_and_report(
    data: Path | None, experiment: str = "chunk-size", params: dict | None = None, search_minutes: float = 0.0
) -> str:
    """What `chunkpilot train` and `retrain` print: trained on the folder `data`, or (None) on what
    the fleet published to the tracking server."""
    if data is None:
        gathered, result = train_from_tracking(experiment, params, search_minutes)
        return f"{_format_gathered(gathered)}\n{format_result(result)}"
    return format_result(train(data, experiment, params, search_minutes))


def _format_gathered(gathered: Gathered) -> str:
    return (
        f"gathered {gathered.profiled} configs and {gathered.telemetry} telemetry batches of "
        f"{len(gathered.machines)} machines ({', '.join(gathered.machines)}) from {len(gathered.runs)} runs "
        f"({gathered.downloaded} files downloaded, the others from the cache)"
    )


def format_result(result: TrainResult) -> str:
    policies = ["lgbm-regressor", *[n for n in result.metrics if n != "lgbm-regressor"]]
    slice_names = list(result.metrics["lgbm-regressor"])
    lines = [f"trained on {result.rows} rows ({result.configs} configs) in {result.seconds:.1f} s"]
    for metric, what in (("mean_regret", "mean regret"), ("p95_regret", "p95 regret")):
        lines += [
            "",
            f"{what} on held-out configs (TTFT of the choice / measured best - 1)",
            f"{'policy':<18}" + "".join(f"{s:>15}" for s in slice_names),
        ]
        for name in policies:
            lines.append(f"{name:<18}" + "".join(f"{result.metrics[name][s][metric]:>15.1%}" for s in slice_names))
    deferred = {n: m["all"]["deferred"] for n, m in result.metrics.items() if m["all"]["deferred"] > 0}  # NaN: no
    lines += [f"{n} took the rule's size on {share:.0%} of held-out configs" for n, share in deferred.items()]
    lines += [
        "",
        "lgbm-regressor per slice (targets: mean regret <= 2.5%, p95 <= 10%, within 5% >= 85%)",
        f"{'slice':<14}{'mean':>8}{'p95':>8}{'top-1':>8}{'within5%':>10}{'MAPE':>8}{'saved/1024':>12}{'saved/rule':>12}",
    ]
    for s, m in result.metrics["lgbm-regressor"].items():
        lines.append(
            f"{s:<14}{m['mean_regret']:>8.1%}{m['p95_regret']:>8.1%}{m['top1']:>8.0%}{m['within_5pct']:>10.0%}"
            f"{m['mape']:>8.1%}{m['saved_vs_1024']:>12.0%}{m['saved_vs_rule']:>12.0%}"
        )
    losses = [
        f"{name} in {s}"
        for name in policies[1:]
        for s in slice_names
        if result.metrics[name][s]["mean_regret"] <= result.metrics["lgbm-regressor"][s]["mean_regret"]
    ]
    lines.append(
        "the model beats every baseline on mean regret in every slice"
        if not losses
        else "the model does NOT beat: " + ", ".join(losses)
    )
    if result.settled:
        lines.append(result.settled)
    lines.append(
        f"registered {registry.MODEL_NAME} v{result.version} as {result.verdict.alias}: {result.verdict.reason}"
    )
    return "\n".join(lines)
