"""`chunkpilot train`: cross-validate every recipe and baseline on the held-out slices, log each as
its own MLflow run with the same metric names, then fit the registered recipe (estimator.recipe:
DEFAULT unless asked otherwise) on all data, log it as one MLflow model and register it, moving
`champion` only through the promotion gate."""

from __future__ import annotations

import importlib.metadata
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import chunkpilot
import estimator
import judge
import store
from chunkpilot.cache import user_cache_dir
from estimator.recipe import COMPATIBLE, DEFAULT, RECIPES, Recipe, make_recipe
from judge.metrics import flat, slice_metrics
from judge.slices import make_slices
from store import registry
from store.dataset import LISTS, DataError
from store.fleet import Gathered, gather
from store.tracking import log_input, quiet_mlflow, tracking_uri, use_experiment

from . import plots, promotion
from .baselines import LINEUP, baselines
from .crossval import cross_validate, fitted, on_recent_telemetry
from .data import Table, hardware_table, load_table
from .memory import MemoryReport, auto_choices, format_memory, judge_memory, pareto_figure
from .progress import Progress
from .promotion import Verdict
from .search import search, slice_regrets
from .served import fit_recipes, served_fit

MODEL_CODE = Path(__file__).with_name("mlflow_model.py")  # the recipe as an MLflow model, logged as code
MODEL_PACKAGES = (chunkpilot, judge, estimator, store)  # what its code imports, carried in the model (code_paths)
MODEL_REQUIREMENTS = ("lightgbm", "numpy", "pandas", "pydantic", "PyYAML", "scipy")  # what that imports

# what the registered recipe is judged beside, each its own run: (every baseline?, the other recipes).
# `all` is the training table; `recipes` drops the baselines that take minutes (the closed loop);
# `quick` keeps only the baselines a user compares against (the demo, a scheduled retrain, the tests)
COMPARE: dict[str, tuple[bool, tuple[str, ...]]] = {
    "all": (True, tuple(RECIPES)),
    "recipes": (False, tuple(RECIPES)),
    "quick": (False, ()),
}


@dataclass
class TrainResult:
    metrics: dict[str, dict[str, dict[str, float]]]  # policy -> slice -> metric
    recipe: str  # the registered recipe's name
    version: str
    verdict: Verdict
    settled: str | None  # what the gate did to a waiting challenger first
    seconds: float
    rows: int
    configs: int
    memory: MemoryReport | None = None  # the memory model held out (None: no row measured its peak)
    sources: dict[str, int] = field(default_factory=dict)  # configs per spec it read (data_sources)
    # registered as champion just before `version`: the recipe on the new profiled rows with only the
    # champion's telemetry, where the gate made `version` wait on new telemetry (training.promotion)
    first: tuple[str, Verdict] | None = None


def _log_dataset(table: Table, source: str) -> None:
    import mlflow

    lineage = table.rows.drop(columns=LISTS)
    log_input(mlflow.data.from_pandas(lineage, source=str(source), name="ttft"), "training")
    telemetry = lineage[lineage.spec_name == "telemetry"]
    if len(telemetry):  # the engine's own prefills, their own input: the compare view shows how they grow
        log_input(mlflow.data.from_pandas(telemetry, source=str(source), name="telemetry"), "training")


def _row_counts(table: Table) -> tuple[int, int]:
    """(profiled rows, telemetry prefills): what the gate weighs differently."""
    telemetry = table.rows.spec_name == "telemetry"
    return int((~telemetry).sum()), int(table.rows.repeats[telemetry].sum())


def data_sources(table: Table) -> dict[str, int]:
    """Configs per spec the data holds (its profiles by name, the engine's prefills as `telemetry`):
    what a training read, as its record and its run say."""
    return {str(k): int(v) for k, v in table.rows.groupby("spec_name").group.nunique().items()}


def data_description(table: Table) -> dict:
    """What a run trained on, in the params every run carries (so the compare view lines them up)."""
    import mlflow

    telemetry = table.rows.finished_at[table.rows.spec_name == "telemetry"]
    return {
        "rows": len(table.rows),
        **dict(zip(("profiled_rows", "telemetry_prefills"), _row_counts(table), strict=True)),
        promotion.TELEMETRY_THROUGH: telemetry.max().isoformat() if len(telemetry) else "",
        "rows_with_chunk_ms": int(table.rows.chunk_ms.notna().sum()),
        "configs": table.rows.group.nunique(),
        "specs": ",".join(f"{name}:{n}" for name, n in data_sources(table).items()),
        "machines": ",".join(sorted(table.rows.hardware_id.unique())),
        "data_digest": mlflow.data.from_pandas(table.rows.drop(columns=LISTS)).digest,
    }


def recipe_description(recipe: Recipe, data: dict) -> dict:
    """The registered recipe's params, as its run logs them and the compare view shows them."""
    return {
        registry.RECIPE: json.dumps({"name": recipe.name, **recipe.params}, sort_keys=True),
        "recipe_name": recipe.name,
        "what": f"recipe: {recipe.cost.kind} cost model, {recipe.cost.size} members, argmin"
        + (f" with do-no-harm at z={recipe.chooser.z:g}" if recipe.chooser.z else ""),
        "cost_model": recipe.cost.kind,
        "members": recipe.cost.size,
        "do_no_harm_z": recipe.chooser.z,
        **COMPATIBLE,
        **data,
    }


def baseline_description(policy, data: dict) -> dict:
    """A baseline's params: what it is (its docstring's first sentence) and the data it trained on."""
    what = " ".join((getattr(policy, "what", None) or type(policy).__doc__ or policy.name).split())
    what = what.split(". ")[0].rstrip(".")
    return {"what": f"baseline: {what}"[:500], **data}


def version_description(recipe: Recipe, data: dict, metrics: dict[str, dict[str, float]] | None) -> str:
    """The registered version's description in the MLflow UI: what it is, what it trained on, how
    it did on held-out configs against the rule and fixed 1024 (the same slices; None: not held out
    on its own)."""
    trained = (
        f"Recipe `{recipe.name}` ({recipe.cost.kind} cost model, {recipe.cost.size} members, "
        f"{f'do-no-harm z={recipe.chooser.z:g}' if recipe.chooser.z else 'the argmin'}). "
        f"Trained on {data['rows']} rows ({data['configs']} configs, "
        f"{data['rows_with_chunk_ms']} with per-chunk times, {data['telemetry_prefills']} telemetry prefills) of "
        f"machines {data['machines']}; data digest {data['data_digest']}."
    )
    if metrics is None:
        return (
            f"{trained} Not held out on its own: the same recipe on the same profiled rows with newer "
            "telemetry too, registered next by the same training, was."
        )
    heldout = metrics["all"]
    return (
        f"{trained} Held out (all slices): mean regret "
        f"{heldout['mean_regret']:.1%}, p95 {heldout['p95_regret']:.1%}, within 5% {heldout['within_5pct']:.0%}, "
        f"TTFT saved vs the hand rule {heldout['saved_vs_rule']:.0%} and vs fixed 1024 "
        f"{heldout['saved_vs_1024']:.0%} of what the measured best saves."
    )


def model_example(hardware: dict) -> pd.DataFrame:
    """Two requests about a machine of the training data: the model's input example in the MLflow UI."""
    machine = {"hardware_id": next(iter(hardware))}
    return pd.DataFrame(
        [
            {"context_length": 4096, "model": "llama-tiny", "hardware": machine, "threads": 2},
            {"context_length": 8000, "model": "mistral-44m", "attention": {"window": 1024}, "hardware": machine},
        ]
    )


@dataclass
class Evidence:
    """How a training judged its recipe on held-out configs: logged with the model it registers."""

    slices: dict
    trials: list[dict]
    frames: dict[str, pd.DataFrame]
    predictions: pd.DataFrame
    memory: MemoryReport | None


def _log_evidence(recipe: Recipe, table: Table, evidence: Evidence) -> None:
    """Inside the model's run: how its recipe did on held-out configs, as artifacts and figures."""
    import mlflow

    mlflow.log_param("slices", json.dumps({k: len(v) for k, v in evidence.slices.items()}))
    if evidence.trials:
        mlflow.log_dict({"trials": evidence.trials}, "search_trials.json")
    for figure, name in (
        (plots.regret_cdf(evidence.frames), "regret_cdf.png"),
        (plots.predicted_vs_measured(evidence.predictions), "predicted_vs_measured.png"),
        (plots.best_chunk_heatmap(table.rows), "best_chunk_heatmap.png"),
    ):
        mlflow.log_figure(figure, name)
        plots.plt.close(figure)
    memory = evidence.memory
    if memory is not None:  # the memory model beside the cost model, judged on held-out configs
        budgets = {f"memory_kept.budget_{b.share:g}": b.kept for b in memory.budgets if b.decisions}
        given_up = {f"memory_given_up.budget_{b.share:g}": b.given_up for b in memory.budgets if b.decisions}
        errors = {"memory_mean_error": memory.mean_error, "memory_p95_error": memory.p95_error}
        margins = {f"memory_margin.{kind}": values[3] for kind, values in memory.per_backend.items()}
        mlflow.log_metrics({**errors, **margins, **budgets, **given_up})
        mlflow.log_text(format_memory(memory), "memory.txt")
        choices = {g: auto_choices(recipe, rows) for g, rows in memory.frame.groupby("group", sort=False)}
        figure = pareto_figure(memory.frame, choices)  # the served recipe's own choices (configs it trained on)
        mlflow.log_figure(figure, "memory_pareto.png")
        plots.plt.close(figure)


def _log_model(
    recipe: Recipe, table: Table, described: dict, source: str, verdict: Verdict, evidence: Evidence | None
) -> str:
    """Inside the model's run: its recipe and what it trained on, how it did on held-out configs
    (`evidence`; None: not held out on its own), the recipe logged as one MLflow model and
    registered. Returns the registered version."""
    import mlflow

    mlflow.set_tags({"role": "model", "policy": recipe.name, "promotion": verdict.reason})
    mlflow.log_params(recipe_description(recipe, described))
    hardware = recipe.hardware
    mlflow.log_dict(hardware, registry.HARDWARE_FILE)
    if evidence is not None:
        _log_evidence(recipe, table, evidence)
    _log_dataset(table, source)
    with tempfile.TemporaryDirectory(prefix="chunkpilot-recipe-") as tmp:
        folder = recipe.save(Path(tmp) / registry.RECIPE)
        (Path(tmp) / registry.HARDWARE_FILE).write_text(json.dumps(hardware))
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(MODEL_CODE),
            artifacts={registry.RECIPE: str(folder), registry.HARDWARE_FILE: str(Path(tmp) / registry.HARDWARE_FILE)},
            code_paths=[str(Path(package.__file__).parent) for package in MODEL_PACKAGES],
            registered_model_name=registry.MODEL_NAME,
            signature=registry.model_signature(),
            input_example=model_example(hardware),
            pip_requirements=[f"{name}=={importlib.metadata.version(name)}" for name in MODEL_REQUIREMENTS],
        )
    return str(info.registered_model_version)


def train(
    data: Path,
    experiment: str = "chunk-size",
    params: dict | None = None,
    search_minutes: float = 0.0,
    source: str | None = None,
    recipe: str = DEFAULT,
    compare: str = "all",
    progress: Progress | None = None,
    older_engines: bool = False,
) -> TrainResult:
    """Cross-validate `recipe` and what `compare` (COMPARE) names beside it on the same slices, each
    its own run; then fit `recipe` on all rows, pass the gate, log and register. `params`:
    LightGBM's, over the cost models' defaults; `source`: where the data came from, for the runs'
    lineage; `progress`: where the stages are told (None: nowhere); `older_engines`: keep rows
    measured by code of their kernel that no longer runs (training/data.load_table)."""
    source = source or str(data)
    import mlflow
    from mlflow import MlflowClient

    start = time.monotonic()
    progress = progress or Progress(None)
    lgbm = dict(params or {})
    table = load_table(data, older_engines)
    slices = make_slices(table.configs)
    if not slices:
        raise DataError("data", f"{data}: the configs differ in nothing that can be held out")
    folds = sum(map(len, slices.values()))
    progress.say(f"{len(table.rows)} rows, {table.rows.group.nunique()} configs; {folds} folds in {', '.join(slices)}")
    trials: list[dict] = []
    if search_minutes > 0:
        progress.say(f"searching LightGBM parameters for {search_minutes:g} min")
        lgbm, trials = search(recipe, lgbm, table, slices, search_minutes)
    every_baseline, recipes = COMPARE[compare]
    judged, compared = {}, {policy.name: policy for policy in baselines(every_baseline)}
    for policy in compared.values():
        judged.update(cross_validate(fitted(lambda p=policy: p), table, slices, progress.stage(policy.name, folds)))
    served = list(dict.fromkeys([recipe, *recipes]))
    stage = progress.stage(f"recipes {', '.join(served)}", folds)
    judged.update(cross_validate(served_fit(served, lgbm), table, slices, stage))
    frames = {name: frame for name, (frame, _) in judged.items()}
    metrics = {name: slice_metrics(frame) for name, frame in frames.items()}
    roles = {name: "recipe" if name in RECIPES else "baseline" for name in judged}
    with quiet_mlflow():
        described = data_description(table)
        experiment_id = use_experiment(experiment)
        client = MlflowClient()
        for name in judged:
            if name == recipe:
                continue
            with mlflow.start_run(experiment_id=experiment_id, run_name=name):
                mlflow.set_tags({"role": roles[name], "policy": name})
                mlflow.log_params(
                    recipe_description(make_recipe(name, lgbm), described)
                    if name in RECIPES
                    else baseline_description(compared[name], described)
                )
                mlflow.log_metrics(flat(metrics[name]))
                _log_dataset(table, source)
        new = {name: m["mean_regret"] for name, m in metrics[recipe].items()}
        memory = judge_memory(table)
        progress.say(f"fitting {recipe} on all {len(table.rows)} rows")
        with tempfile.TemporaryDirectory(prefix="chunkpilot-recipe-") as tmp:
            final = fit_recipes([recipe], lgbm, table, Path(tmp), hardware_table(table.rows))[recipe]
        progress.say("the promotion gate, then logging and registering the model")
        with promotion.one_promoter(tracking_uri()):  # a second retrain on this store judges after this one
            settled = promotion.settle(client, on_recent_telemetry(data, tracking_uri()), COMPATIBLE)

            def gated() -> Verdict:
                return promotion.gate(
                    client,
                    new,
                    {"name": final.name, **final.params},
                    _row_counts(table),
                    lambda theirs: slice_regrets(theirs, table, slices),
                    COMPATIBLE,
                )

            verdict, first, before = gated(), None, settled
            if verdict.profiled_first is not None:
                progress.say("the new profiled rows with only the champion's telemetry first")
                first = _promote_profiled_first(
                    client, data, older_engines, (final.name, lgbm), verdict, settled, experiment_id, source
                )
                if first is not None:  # judged again, against the champion just registered; said after it
                    verdict = gated()
                    before = "; ".join(filter(None, [settled, f"v{first[0]} {first[1].alias}: {first[1].reason}"]))
            with mlflow.start_run(experiment_id=experiment_id, run_name=recipe):
                mlflow.log_metrics(flat(metrics[recipe]))
                evidence = Evidence(slices, trials, frames, judged[recipe][1], memory)
                version = _log_model(final, table, described, source, verdict, evidence)
            promotion.register(client, version, verdict, new["all"], before)
        _describe_version(client, version, final, described, metrics[recipe])
    return TrainResult(
        metrics,
        recipe,
        version,
        verdict,
        settled,
        time.monotonic() - start,
        len(table.rows),
        table.rows.group.nunique(),
        memory,
        data_sources(table),
        first,
    )


def _promote_profiled_first(
    client,
    data: Path,
    older_engines: bool,
    recipe: tuple[str, dict],
    verdict: Verdict,
    settled: str | None,
    experiment_id: str,
    source: str,
) -> tuple[str, Verdict] | None:
    """Where the gate made the champion's recipe retrained on new telemetry and new profiled rows wait
    (`verdict.profiled_first`): the recipe fitted on every profiled row and only the telemetry the
    champion had, logged and registered as champion (the gate promotes more profiled rows alone), so
    that a backend or machine just profiled serves now while the new telemetry waits to be judged.
    Returns (its version, its verdict); None where the champion's telemetry does not read back as
    it had it (its count differs): the whole data then waits, as the gate said. `recipe`: its name
    and LightGBM params (the champion's); `settled`: what `settle` did before, recorded with it."""
    import mlflow

    (name, lgbm), (more, had, through) = recipe, verdict.profiled_first
    before = pd.Timestamp(through) if through else pd.Timestamp(0, tz="UTC")  # "": it had none
    table = load_table(data, older_engines, telemetry_through=before)
    if _row_counts(table)[1] != had:
        return None
    with tempfile.TemporaryDirectory(prefix="chunkpilot-recipe-") as tmp:
        fit = fit_recipes([name], lgbm, table, Path(tmp), hardware_table(table.rows))[name]
    reason = (
        f"champion v{verdict.champion_version}'s recipe retrained on {more} more profiled rows with only the "
        f"{had} prefills of telemetry it had (the newer prefills wait in the next version)"
    )
    first = Verdict(registry.CHAMPION, reason, verdict.champion_version, None)
    described = data_description(table)
    with mlflow.start_run(experiment_id=experiment_id, run_name=name):
        version = _log_model(fit, table, described, source, first, None)
    promotion.register(client, version, first, None, settled)
    _describe_version(client, version, fit, described, None)
    return version, first


def _describe_version(client, version: str, recipe: Recipe, described: dict, metrics: dict | None) -> None:
    """The registered version's page: its description (version_description) and its recipe's name."""
    client.update_model_version(registry.MODEL_NAME, version, version_description(recipe, described, metrics))
    client.set_model_version_tag(registry.MODEL_NAME, version, "recipe", recipe.name)


def train_from_tracking(
    experiment: str = "chunk-size",
    params: dict | None = None,
    search_minutes: float = 0.0,
    recipe: str = DEFAULT,
    compare: str = "all",
    progress: Progress | None = None,
) -> tuple[Gathered, TrainResult]:
    """`train` on every partition the fleet published to the tracking server (store/fleet.py):
    each machine's profiled configs and the services' telemetry batches."""
    from mlflow import MlflowClient

    uri = tracking_uri()
    with tempfile.TemporaryDirectory(prefix="chunkpilot-fleet-") as tmp:
        with quiet_mlflow():
            gathered = gather(MlflowClient(uri), Path(tmp) / "ttft", user_cache_dir() / "partitions")
        source = f"{uri} ({len(gathered.runs)} publishing runs)"
        return gathered, train(gathered.root, experiment, params, search_minutes, source, recipe, compare, progress)


def train_and_report(
    data: Path | None,
    experiment: str = "chunk-size",
    params: dict | None = None,
    search_minutes: float = 0.0,
    recipe: str = DEFAULT,
    compare: str = "all",
    older_engines: bool = False,
    done: Callable[[TrainResult], None] | None = None,
) -> str:
    """What `chunkpilot train`, `retrain` and the demo print: trained on the folder `data`, or
    (None) on what the fleet published to the tracking server; the stages meanwhile on stderr.
    `done` is handed the result (the CLI records it)."""
    if data is None:
        gathered, result = train_from_tracking(experiment, params, search_minutes, recipe, compare, Progress())
        said = f"{_format_gathered(gathered)}\n{format_result(result)}"
    else:
        result = train(data, experiment, params, search_minutes, None, recipe, compare, Progress(), older_engines)
        said = format_result(result)
    if done is not None:
        done(result)
    return said


def _format_gathered(gathered: Gathered) -> str:
    return (
        f"gathered {gathered.profiled} configs and {gathered.telemetry} telemetry batches of "
        f"{len(gathered.machines)} machines ({', '.join(gathered.machines)}) from {len(gathered.runs)} runs "
        f"({gathered.downloaded} files downloaded, the others from the cache)"
        + (f"; {len(gathered.refused)} refused (first: {gathered.refused[0]})" if gathered.refused else "")
    )


def format_result(result: TrainResult) -> str:
    served = result.recipe
    policies = [served, *[n for n in result.metrics if n != served]]
    slice_names = list(result.metrics[served])
    width = max(14, *(len(s) + 2 for s in slice_names))
    lines = [
        f"trained on {result.rows} rows ({result.configs} configs) in {result.seconds:.1f} s; "
        f"registered recipe: {served} (marked *)"
    ]
    for metric, what in (("mean_regret", "mean regret"), ("p95_regret", "p95 regret")):
        lines += [
            "",
            f"{what} on held-out configs (TTFT of the choice / measured best - 1), the same code as serves",
            f"{'policy':<22}" + "".join(f"{s:>{width}}" for s in slice_names),
        ]
        for name in policies:
            mark = " *" if name == served else ""
            lines.append(
                f"{name + mark:<22}" + "".join(f"{result.metrics[name][s][metric]:>{width}.1%}" for s in slice_names)
            )
    deferred = {n: m["all"]["deferred"] for n, m in result.metrics.items() if m["all"]["deferred"] > 0}  # NaN: no
    lines += [
        f"{n}: the anchor's size on {share:.0%} of held-out configs (a kind the model does not know, or do-no-harm)"
        for n, share in deferred.items()
    ]
    lines += [
        "",
        f"{served} per slice (targets: mean regret <= 2.5%, p95 <= 10%, within 5% >= 85%)",
        f"{'slice':<{width}}{'mean':>8}{'p95':>8}{'top-1':>8}{'within5%':>10}{'MAPE':>8}{'saved/1024':>12}{'saved/rule':>12}",
    ]
    for s, m in result.metrics[served].items():
        lines.append(
            f"{s:<{width}}{m['mean_regret']:>8.1%}{m['p95_regret']:>8.1%}{m['top1']:>8.0%}{m['within_5pct']:>10.0%}"
            f"{m['mape']:>8.1%}{m['saved_vs_1024']:>12.0%}{m['saved_vs_rule']:>12.0%}"
        )
    simple = [n for n in policies if n in LINEUP]
    if simple:
        lines += [
            "",
            f"{served} against the strongest simple baseline of each slice (lowest mean regret of the lineup)",
        ]
        for s in slice_names:
            best = min(simple, key=lambda n, s=s: result.metrics[n][s]["mean_regret"])
            ours, theirs = result.metrics[served][s]["mean_regret"], result.metrics[best][s]["mean_regret"]
            verdict = "beats it" if ours < theirs else "does NOT beat it"
            lines.append(f"{s:<{width}}{best:<22}{theirs:>8.1%} vs {ours:>6.1%}: {served} {verdict}")
    losses = [
        f"{name} in {s}"
        for name in policies[1:]
        for s in slice_names
        if result.metrics[name][s]["mean_regret"] <= result.metrics[served][s]["mean_regret"]
    ]
    lines.append(
        f"{served} beats every other policy on mean regret in every slice"
        if not losses
        else f"{served} does NOT beat: " + ", ".join(losses)
    )
    if result.memory is not None:
        lines += ["", format_memory(result.memory)]
    if result.settled:
        lines.append(result.settled)
    if result.first is not None:
        version, verdict = result.first
        lines.append(f"registered {registry.MODEL_NAME} v{version} as {verdict.alias}: {verdict.reason}")
    lines.append(
        f"registered {registry.MODEL_NAME} v{result.version} as {result.verdict.alias}: {result.verdict.reason}"
    )
    return "\n".join(lines)
