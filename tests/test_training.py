"""`chunkpilot train`: bad datasets are refused in one line; choices stay feasible; the promotion
gate keeps a better champion; training works against a real `mlflow server`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import servers
from conftest import QUICK_ARGS, QUICK_TREES, sqlite_store

from cli import main
from estimator.recipe import DEFAULT, RECIPES
from store.registry import MODEL_NAME
from training.baselines import baselines
from training.data import load_table
from training.promotion import gate, judge
from training.served import served_fit


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_bad_datasets_are_refused_in_one_line(tmp_path, small_dataset, capsys, store):
    assert "does not exist" in one_line_error(capsys, ["train", "--data", str(tmp_path / "nothing")])
    (tmp_path / "empty").mkdir()
    assert "no dataset files" in one_line_error(capsys, ["train", "--data", str(tmp_path / "empty")])
    files = sorted(small_dataset.rglob("*.parquet"))
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(files[0], one)
    assert "one config only" in one_line_error(capsys, ["train", "--data", str(one)])
    same_chunk = tmp_path / "same-chunk"
    same_chunk.mkdir()
    for f in files[:4]:
        table = pq.read_table(f)
        pq.write_table(table.filter(np.asarray(table["chunk_size"]) == 16), same_chunk / f.name)
    assert "nothing to choose between" in one_line_error(capsys, ["train", "--data", str(same_chunk)])
    broken = tmp_path / "broken"
    broken.mkdir()
    pq.write_table(pq.read_table(files[0]).drop(["ttft_ms"]), broken / files[0].name)
    assert "missing columns ttft_ms" in one_line_error(capsys, ["train", "--data", str(broken)])
    (broken / files[0].name).write_bytes(b"not parquet at all")
    assert "not a readable Parquet file" in one_line_error(capsys, ["train", "--data", str(broken)])
    assert "n_estimators" in one_line_error(capsys, ["train", "--data", str(small_dataset), "--n-estimators", "0"])
    assert "search_minutes" in one_line_error(capsys, ["train", "--data", str(small_dataset), "--search-minutes", "-1"])
    assert "recipe: must be one of per-chunk" in one_line_error(capsys, ["train", "--recipe", "best"])
    assert "compare: must be one of all, recipes, quick" in one_line_error(capsys, ["retrain", "--compare", "every"])


def test_every_policy_chooses_a_measured_feasible_chunk(small_dataset):
    table = load_table(small_dataset)
    groups = table.configs.group.to_numpy()
    train, test = table.subset(groups[::2]), table.subset(groups[1::2])
    policies = served_fit(list(RECIPES), {})(train)
    for policy in baselines():
        policy.fit(train)
        policies[policy.name] = policy
    for name, policy in policies.items():
        chosen = policy.choose(test).chunks
        for g, rows in test.rows.groupby("group"):
            assert chosen[g] in set(rows.chunk_size), (name, g)
            if rows.layout.iloc[0] == "ring":
                assert chosen[g] <= rows.window.iloc[0], (name, g)


def aliases(client) -> dict[str, str]:
    return {
        a: str(client.get_model_version_by_alias(MODEL_NAME, a).version)
        for a in ("champion", "challenger")
        if _has_alias(client, a)
    }


def _has_alias(client, alias: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version_by_alias(MODEL_NAME, alias)
        return True
    except MlflowException:
        return False


def test_per_chunk_rows_follow_each_candidate_s_chunks(small_dataset):
    from estimator.cost_models import PerChunk, expand

    table = load_table(small_dataset)
    owner, q, h = expand(table.x)
    rows = table.rows
    assert len(owner) == rows.num_chunks.sum() == sum(len(ms) for ms in rows.chunk_ms)
    first = rows.index[(rows.context_length == 400) & (rows.chunk_size == 128)][0]
    mine = owner == first
    assert q[mine].tolist() == [128, 128, 128, 16] and h[mine].tolist() == [0, 128, 256, 384]
    model = PerChunk(size=3)
    model.fit(table.measured)
    members = model.members(table.x)  # [members, rows] log ms
    assert members.shape == (3, len(rows)) and np.isfinite(members).all()
    assert (members.std(0) > 0).any()  # the members differ: that spread is the uncertainty


def test_a_backend_without_chunk_times_is_priced_whole_by_the_per_candidate_model(small_dataset, tmp_path):
    from dataclasses import replace

    from chunkpilot.features import BACKEND_CODES, FEATURES
    from estimator.cost_models import Measured, PerChunk

    data = load_table(small_dataset).measured
    generate = np.arange(len(data.x)) % 2 == 1  # half the rows as stock generate measured them: TTFT only
    x = data.x.copy()
    x[generate, FEATURES.index("backend")] = BACKEND_CODES["transformers"]
    chunk_ms = [None if g else ms for g, ms in zip(generate, data.chunk_ms, strict=True)]
    model = PerChunk(size=2)
    model.fit(Measured(x, data.ttft_ms, data.tokenize_ms, chunk_ms))
    assert model.timed == [BACKEND_CODES["chunkpilot"]]
    members = model.members(x)
    assert np.array_equal(members[:, generate], model.untimed.members(x[generate]))
    summed = replace(model, timed=list(BACKEND_CODES.values()))  # every plan as the sum of its chunks
    assert np.array_equal(members[:, ~generate], summed.members(x[~generate]))
    unseen = x[:3].copy()
    unseen[:, FEATURES.index("backend")] = BACKEND_CODES["llama.cpp"]  # never profiled: whole plans too
    assert np.array_equal(model.members(unseen), model.untimed.members(unseen))
    loaded = PerChunk.load(tmp_path, model.save(tmp_path))
    assert np.array_equal(loaded.members(x), members)


def test_gate_promotes_only_a_strictly_better_model():
    assert judge(0.02, None).alias == "champion"
    assert judge(0.02, ("3", 0.05)).alias == "champion"
    worse = judge(0.05, ("3", 0.02))
    assert worse.alias == "challenger" and "does not beat champion v3's 0.0200" in worse.reason
    assert judge(0.02, ("3", 0.02)).alias == "challenger"  # a tie keeps the champion


def test_the_champion_s_recipe_retrained_on_new_telemetry_waits_and_its_new_profiled_rows_are_promoted_first():
    """A unit test with a stub of MLflow's client (a fake, saying so): the champion's run params are
    all the gate reads. More profiled rows alone promote; more telemetry makes a waiting challenger.
    With both, the verdict names the champion's telemetry (its count and its latest finish) so that
    training can promote the new profiled rows with only that telemetry first (a backend just
    profiled serves at once); a champion whose run does not say when its telemetry ends (an older
    ChunkPilot) leaves the profiled rows waiting, as its reason says."""
    from types import SimpleNamespace

    from training.promotion import ProfiledFirst

    recipe = {"name": DEFAULT, "z": 2.0}
    through = "2026-12-07T10:00:00.123456+00:00"

    def verdict(rows: tuple[int, int], telemetry: int = 10, **params: str):
        params = {"recipe": json.dumps(recipe), "profiled_rows": "100", "telemetry_prefills": str(telemetry), **params}
        client = SimpleNamespace(
            get_model_version_by_alias=lambda name, alias: SimpleNamespace(version="1", run_id="r1"),
            get_run=lambda run_id: SimpleNamespace(data=SimpleNamespace(params=params)),
        )
        return gate(client, {"all": 0.03}, recipe, rows, lambda theirs: {}, {})

    profiled = verdict((128, 10), telemetry_through=through)
    assert profiled.alias == "champion" and "on 28 more profiled rows" in profiled.reason
    assert profiled.profiled_first is None
    both = verdict((128, 34), telemetry_through=through)
    assert both.alias == "challenger" and both.waits
    assert "on 24 more prefills of telemetry and 28 more profiled rows, which serve once it is promoted" in both.reason
    assert both.profiled_first == ProfiledFirst(28, 10, through)
    assert verdict((128, 34), telemetry=0).profiled_first == ProfiledFirst(28, 0, "")  # it had none: all are new
    assert verdict((128, 34)).profiled_first is None  # which prefills it had is unknown: all wait, as it says
    telemetry = verdict((100, 34), telemetry_through=through)
    assert telemetry.waits and "profiled rows" not in telemetry.reason and telemetry.profiled_first is None


def test_a_model_that_is_not_better_does_not_become_champion(small_dataset, store, capsys):
    from mlflow import MlflowClient

    # every recipe and baseline judged (the default --compare), on QUICK_TREES trees a member
    assert main(["train", "--data", str(small_dataset), "--n-estimators", str(QUICK_TREES)]) == 0
    first = capsys.readouterr().out
    assert "registered chunk-size-predictor v1 as champion: no champion yet" in first
    assert "mean regret on held-out configs" in first and "lgbm-classifier" in first
    # the same recipe again (training is deterministic): it ties the champion, so it must not replace it
    assert main(["train", "--data", str(small_dataset), *QUICK_ARGS]) == 0
    second = capsys.readouterr().out
    assert "v2 as challenger" in second and "does not beat champion v1" in second
    client = MlflowClient()
    assert aliases(client) == {"champion": "1", "challenger": "2"}
    runs = client.search_runs([client.get_experiment_by_name("chunk-size").experiment_id])
    names = {r.info.run_name for r in runs}
    assert names >= {
        "one-shot",
        "backend-default",
        "best-single-size",
        "fixed-1024",
        "hand-rule",
        "simple-rule",
        "strongest-baseline",
        "analytic-fit",
        "nearest-config",
        "lgbm-classifier",
        "lgbm-ranker",
        "lgbm-rank-level",
        *RECIPES,
    }
    do_no_harm = next(r for r in runs if r.info.run_name == "per-candidate")
    assert do_no_harm.data.tags["role"] == "recipe" and 0 <= do_no_harm.data.metrics["deferred"] <= 1
    assert do_no_harm.data.params["cost_model"] == "per-candidate"  # the compare view's parameter rows
    model_runs = [r for r in runs if r.data.tags.get("role") == "model"]
    baseline_runs = [r for r in runs if r.data.tags.get("role") == "baseline"]
    assert {r.info.run_name for r in model_runs} == {DEFAULT}
    assert {"mean_regret", "mean_regret.context"} <= set(model_runs[0].data.metrics)
    assert {"mean_regret", "mean_regret.context"} <= set(baseline_runs[0].data.metrics)  # one view compares them
    artifacts = {a.path for a in client.list_artifacts(model_runs[-1].info.run_id)}
    assert {"regret_cdf.png", "predicted_vs_measured.png", "best_chunk_heatmap.png", "hardware.json"} <= artifacts
    assert model_runs[-1].inputs.dataset_inputs[0].dataset.name == "ttft"
    assert model_runs[-1].data.params["recipe_name"] == DEFAULT
    # the compare view explains every run: what it is and what it trained on, baselines included
    for run in runs:
        assert run.data.params["what"].startswith(("recipe:", "baseline:"))
        assert {"rows", "configs", "machines", "data_digest"} <= set(run.data.params)
    rule = next(r for r in runs if r.info.run_name == "hand-rule")
    assert "hand rule engines' users write" in rule.data.params["what"]
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")  # the model page says what it is
    assert champion.tags["recipe"] == DEFAULT
    digest = model_runs[-1].data.params["data_digest"]
    assert f"Recipe `{DEFAULT}`" in champion.description and digest in champion.description
    assert "Held out (all slices): mean regret" in champion.description


@pytest.fixture
def mlflow_server(tmp_path):
    with servers.mlflow_server(sqlite_store(tmp_path / "server.db"), str(tmp_path / "artifacts")) as url:
        yield url


def test_training_against_a_real_mlflow_server(small_dataset, mlflow_server, monkeypatch, tmp_path, capsys):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", str(small_dataset), *QUICK_ARGS]) == 0
    said = capsys.readouterr()
    assert "as champion" in said.out
    # the stages as they go, on stderr: each policy's folds, the final fit, the gate
    assert f"recipes {DEFAULT}: " in said.err and "hand-rule: fold " in said.err
    assert f"fitting {DEFAULT} on all" in said.err and "the promotion gate" in said.err
    version = MlflowClient(tracking_uri=mlflow_server).get_model_version_by_alias(MODEL_NAME, "champion")
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    served = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")  # the recipe as one MLflow model
    hardware = {"matmul_gflops": 250.0, "bandwidth_gbs": 40.0, "call_overhead_ms": 0.9, "cores": 2}
    requests = pd.DataFrame([{"context_length": n, "model": "llama-tiny", "hardware": hardware} for n in (300, 3000)])
    decided = served.predict(requests)  # one decision per request
    assert str(version.version) == "1" and decided.chunk_size.between(1, 3000).all()
    assert decided.rule_chunk_size.tolist() == [300, 768]  # the hand rule: one shot, then 768
    with pytest.raises(MlflowException, match=r"row 0\.attention: is not valid JSON"):
        served.predict(requests.assign(attention='{"window": '))
    assert not (tmp_path / "mlruns").exists()  # everything went to the server


def test_search_starts_from_the_defaults_and_keeps_the_best_trial(small_dataset):
    from judge.slices import make_slices
    from training.search import search

    table = load_table(small_dataset)
    best, trials = search(DEFAULT, {}, table, make_slices(table.configs), minutes=0.01)
    assert set(trials[0]) == {"mean_regret", "seconds"}  # the defaults (no override) are always tried first
    winner = min(trials, key=lambda t: t["mean_regret"])
    assert best == {k: v for k, v in winner.items() if k not in ("mean_regret", "seconds")}


def test_a_champion_of_an_older_chunkpilot_is_replaced(tmp_path):
    """After an upgrade that changes the features or the recipe's format (or registers recipes), the
    old champion cannot serve (the service refuses to load it, saying why); the gate replaces it
    without re-measuring it."""
    from mlflow import MlflowClient

    from training.promotion import gate

    client = MlflowClient(tracking_uri=sqlite_store(tmp_path / "mlflow.db"))
    client.create_registered_model(MODEL_NAME)
    run = client.create_run(client.create_experiment("older"))
    client.log_param(run.info.run_id, "features", "context_length,chunk_size")
    client.create_model_version(MODEL_NAME, source=str(tmp_path), run_id=run.info.run_id)
    client.set_registered_model_alias(MODEL_NAME, "champion", "1")

    def remeasure(recipe):
        raise AssertionError("an old champion's recipe is not re-measured")

    client.log_param(run.info.run_id, "recipe_format", "1")

    def verdict(features: str, recipe_format: str = "1"):
        compatible = {"features": features, "recipe_format": recipe_format}
        return gate(client, {"all": 0.2}, {"name": DEFAULT}, (10, 0), remeasure, compatible)

    assert verdict("context_length,chunk_size,global_tokens").alias == "champion"
    assert "trained by an older ChunkPilot" in verdict("context_length,chunk_size,global_tokens").reason
    assert verdict("context_length,chunk_size", recipe_format="2").alias == "champion"  # saved otherwise
    client.log_param(run.info.run_id, "lgbm_params", "{}")  # features and format match, but it is no recipe
    assert verdict("context_length,chunk_size").alias == "champion"
    assert "no recipe" in verdict("context_length,chunk_size").reason


def test_training_keeps_only_rows_that_today_s_code_of_their_kernel_measured():
    """A row labelled with a kernel was measured by that kernel's code as it runs today, or training
    leaves it out (unless told --older-engines): every kernel a backend runs names the first harness
    version of its current code, and the shipped rows the table keeps are all of that code's."""
    from chunkpilot.contract import ATTN_IMPLS, BACKENDS, ConfigError, check_attn_impl
    from store.dataset import KERNEL_SINCE, contended, latest, measured_by_today, read_dataset

    runs = set()
    for backend in BACKENDS:
        for kernel in ATTN_IMPLS:
            try:
                check_attn_impl(kernel, backend, "cpu")
                runs.add((backend, kernel))
            except ConfigError:
                pass
    assert runs <= KERNEL_SINCE.keys()
    shipped = Path(__file__).resolve().parents[1] / "data" / "ttft"  # with a demo's rows, if one ran here
    every, kept = read_dataset(shipped), load_table(shipped).rows
    assert measured_by_today(kept).all() and len(kept) < len(every)  # the older engine's rows are left out
    # told to, every profiled row is kept, but for those timed beside other work and a size measured
    # again (its latest row counts); a demo's telemetry, one row per prefill, is merged per size
    quiet = latest(every[~contended(every)])
    profiled = (quiet.spec_name != "telemetry").sum()
    assert (load_table(shipped, older_engines=True).rows.spec_name != "telemetry").sum() == profiled


def test_the_memory_model_fits_only_peaks_today_s_method_of_their_backend_measured():
    """Every backend names the first harness version whose `prefill_memory_bytes` today's code
    measures; the shipped rows of an older method (the bundled engine's resident set, harness 8) are
    in the data but not in what the memory model fits, and some of today's are."""
    from chunkpilot.contract import BACKENDS
    from store.dataset import MEMORY_SINCE, memory_measured, read_dataset
    from training.memory import measured_memory

    assert set(BACKENDS) == MEMORY_SINCE.keys()
    every = read_dataset(Path(__file__).resolve().parents[1] / "data" / "ttft")
    older = (every.prefill_memory_bytes > 0) & (every.backend == "chunkpilot") & (every.harness_version == "8")
    assert older.any() and not memory_measured(every)[older].any()
    table = load_table(Path(__file__).resolve().parents[1] / "data" / "ttft")
    rows, _ = measured_memory(table)
    assert set(rows.backend) == set(BACKENDS) and memory_measured(rows).all()
    assert (table.measured.memory_bytes > 0).sum() == len(rows)  # what the recipe fits: the same rows


def test_a_machine_s_sweep_is_one_fact_for_its_anchor_and_the_race_s_best_single_size():
    """One reading of "this machine's best single size": its profiled rows measured by today's code,
    each size's latest measurement (store.dataset.anchor_configs). Training's table (the recipe's
    anchors) and the race's lineup (evaluation.lineup.machine_best) both read it; the telemetry of
    `auto`'s own choices is no sweep and moves nothing."""
    import pandas as pd

    from chunkpilot.paths import TELEMETRY_PREFIX
    from judge.lineup import best_single_size
    from store.dataset import anchor_configs, read_dataset

    shipped = Path(__file__).resolve().parents[1] / "data" / "ttft"
    rows = read_dataset(shipped)

    def best(rows: pd.DataFrame) -> dict[str, str]:
        return {key: best_single_size(configs) for key, configs in anchor_configs(rows).items()}

    swept = best(rows)
    assert {key: best_single_size(c) for key, c in load_table(shipped).anchor_configs.items()} == swept
    # telemetry that made a poor size look instant on every config of the machines changes nothing
    poor = rows[rows.chunk_size == 64].assign(
        spec_name="telemetry", config_key=lambda r: TELEMETRY_PREFIX + r.config_key, ttft_ms=0.001
    )
    assert best(pd.concat([rows, poor], ignore_index=True)) == swept
    # a later measurement of a size replaces the earlier one
    key = next(iter(swept))
    hardware, backend, kernel = key.split("/")
    mine = rows[(rows.hardware_id == hardware) & (rows.backend == backend) & (rows.attn_impl == kernel)]
    later = mine[mine.chunk_size == 64].assign(ttft_ms=0.001, finished_at=rows.finished_at.max())
    assert best(pd.concat([rows, later], ignore_index=True))[key] == "64" != swept[key]
