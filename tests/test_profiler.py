"""The profiling harness: spec expansion, feasibility, schema checks, summary regrets, a tiny real
sweep, and a sweep killed with SIGKILL then resumed."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from conftest import sqlite_store

from chunkpilot.contract import ConfigError
from chunkpilot.features import prefill_flops
from cli import main
from profiler.plan import space_filling_order
from profiler.spec import ProfileConfig, Spec
from profiler.summary import summarize_configs
from store.dataset import (
    COLUMNS,
    HARNESS_VERSION,
    OPTIONAL,
    DataError,
    finished_keys,
    read_dataset,
    read_file,
    validate,
    write_config,
)

TINY = {
    "name": "tiny",
    "repeats": 2,
    "chunk_sizes": [8, 16, 64, "full"],
    "sweeps": [
        {
            "models": ["llama-tiny"],
            "contexts": [40, 100],
            "attention": [{"window": None}, {"window": 16, "layout": "ring", "sinks": 2}],
            "threads": [1],
        }
    ],
}


def write_spec(tmp_path: Path, spec: dict) -> Path:
    import yaml

    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_spec_expands_sweeps_without_duplicates():
    spec = Spec.from_dict({**TINY, "sweeps": TINY["sweeps"] * 2})
    assert len(spec.configs) == 4 and len({c.key for c in spec.configs}) == 4
    ranged = Spec.from_dict(
        {**TINY, "sweeps": [{**TINY["sweeps"][0], "contexts": {"min": 128, "max": 16384, "count": 9}}]}
    )
    lengths = sorted({c.context_length for c in ranged.configs})
    assert lengths[0] == 128 and lengths[-1] == 16384 and len(lengths) == 9
    assert any(n & (n - 1) for n in lengths)  # not only powers of two


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "a b"}, "name"),
        ({"repeats": 0}, "repeats"),
        ({"chunk_sizes": [0]}, "chunk_sizes"),
        ({"sweeps": [{"models": ["llama-tiny"], "contexts": [10], "dtypes": ["fp8"]}]}, "dtypes"),
        ({"sweeps": [{"models": ["llama-tiny"], "contexts": []}]}, "contexts"),
        (
            {"sweeps": [{"models": ["llama-tiny"], "contexts": [10], "attention": [{"window": 8, "size": 2}]}]},
            "attention",
        ),
    ],
)
def test_bad_spec_names_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        Spec.from_dict({**TINY, **change})
    assert field in err.value.field.split("."), err.value  # e.g. sweeps.0.dtypes.0


def test_infeasible_candidates_are_skipped_with_a_reason():
    ring = ProfileConfig("llama-tiny", 300, 128, "ring", 0, "float32", 1, "masked")
    chunks, skipped = ring.candidates((64, 128, 256, 512, "full"))
    assert chunks == [64, 128]
    assert skipped == [
        "256: ring layout needs chunk <= window (128)",
        "512: larger than the context (300)",
        "full: ring layout needs chunk <= window (128)",
    ]
    shift = ProfileConfig("llama-tiny", 300, 128, "shift", 0, "float32", 1, "masked")
    assert shift.candidates((64, 256, 512, "full"))[0] == [64, 256, 300]


def test_space_filling_order_covers_every_level_first():
    spec = Spec.from_dict(
        {
            "name": "grid",
            "sweeps": [
                {
                    "models": ["llama-tiny", "qwen2-gqa"],
                    "contexts": [128, 512, 2048, 8192],
                    "attention": [{"window": None}, {"window": 256}, {"window": 1024, "layout": "ring"}],
                    "dtypes": ["float32", "bfloat16"],
                    "threads": [1, 2],
                }
            ],
        }
    )
    order = space_filling_order(list(spec.configs))
    assert sorted(order, key=lambda c: c.key) == sorted(spec.configs, key=lambda c: c.key)
    head = order[:8]
    for level in ("model", "dtype", "threads"):
        assert len({getattr(c, level) for c in head}) == 2, level
    assert {c.context_length for c in order[:12]} >= {128, 8192}


def fixture_rows(key: str, n: int, ttft: dict[int, float], window: int = 0, layout: str = "none") -> pd.DataFrame:
    """Schema-complete rows for one config, with made-up (not measured) times: for store and summary tests."""
    now = datetime.now(UTC)
    base = dict(
        config_key=key,
        spec_name="fixture",
        model="llama-tiny",
        family="llama",
        num_layers=4,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=4,
        head_dim=64,
        intermediate_size=768,
        vocab_size=4096,
        global_every=0,
        parameters=5_500_000,
        context_length=n,
        window=window,
        layout=layout,
        sinks=0,
        dtype="float32",
        threads=1,
        attn_impl="masked",
        hardware_id="abc",
        device_kind="cpu",
        device_name="test cpu",
        cores=2,
        l2_cache_bytes=1,
        l3_cache_bytes=1,
        memory_bytes=1,
        matmul_gflops=100.0,
        bandwidth_gbs=10.0,
        call_overhead_ms=1.0,
        torch_version="t",
        transformers_version="t",
        allocator="a",
        tokenize_ms=1.0,
        first_decode_ms=1.0,
        ttft_iqr_ms=0.0,
        ttft_cv=0.01,
        repeats=2,
        kv_cache_bytes=1,
        peak_memory_bytes=1,
        noisy=False,
        remeasured=0,
        started_at=now,
        finished_at=now,
        harness_version="1",
    )
    rows = []
    for chunk, ms in ttft.items():
        k = math.ceil(n / chunk)
        rows.append(
            {
                **base,
                "chunk_size": chunk,
                "is_full": chunk == n,
                "num_chunks": k,
                "last_chunk": n - (k - 1) * chunk,
                "prefill_ms": ms - 2,
                "ttft_ms": ms,
                "ttft_repeats_ms": [ms, ms],
                "prefill_repeats_ms": [ms - 2] * 2,
            }
        )
    return pd.DataFrame(rows)[[c for c in COLUMNS if c not in OPTIONAL]]  # a version-1 row: no per-chunk times


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("ttft_ms", -1.0, "ttft_ms: .* row 1: must be > 0"),
        ("ttft_ms", float("nan"), "ttft_ms"),
        ("chunk_size", 5000, "chunk_size"),
        ("layout", "spiral", "layout: .* must be one of"),
        ("ttft_repeats_ms", [1.0], "ttft_repeats_ms"),
        ("threads", 0, "threads"),
        ("sinks", 5000, "sinks: .* row 1: must be <= 4096"),  # the contract's bound (AttentionConfig.sinks)
    ],
)
def test_schema_refuses_bad_rows_naming_them(tmp_path, column, value, message):
    rows = fixture_rows("cfg", 2048, {512: 100.0, 1024: 90.0})
    rows.at[1, column] = value
    with pytest.raises(DataError, match=message):
        write_config(tmp_path, "cfg", rows)
    assert finished_keys(tmp_path) == set()  # nothing half-written
    with pytest.raises(DataError, match="missing columns ttft_ms"):
        validate(rows.drop(columns=["ttft_ms"]), "x")


def test_version_1_files_read_without_chunk_times_and_bad_chunk_times_are_refused(tmp_path):
    shipped = sorted(Path(__file__).parents[1].glob("data/ttft/cpu-shipped/664de6bcf2e9/*.parquet"))
    first = next(rows for rows in map(read_file, shipped) if (rows.harness_version == "1").all())
    assert first.chunk_ms.isna().all()  # measured before the column existed
    rows = fixture_rows("new", 100, {64: 5.0, 100: 4.0}).assign(chunk_ms=[[2.0, 1.0], [3.0]])
    write_config(tmp_path, "new", rows)
    assert [list(x) for x in read_dataset(tmp_path).set_index("config_key").loc["new"].chunk_ms] == [[2.0, 1.0], [3.0]]
    with pytest.raises(DataError, match="chunk_ms: .* row 1: needs 1 positive chunk times"):
        write_config(tmp_path, "bad", rows.assign(chunk_ms=[[2.0, 1.0], [1.0, 2.0]]))


def test_reading_a_corrupt_file_is_refused(tmp_path):
    write_config(tmp_path, "good", fixture_rows("good", 100, {64: 5.0, 100: 4.0}))
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="bad.parquet is not a readable Parquet file"):
        read_dataset(tmp_path)


def test_summary_regrets_match_a_hand_computation():
    df = pd.concat(
        [
            # 3000 tokens, no window: best 768 (100 ms); 1024 -> 110 ms (10%); the rule says 768 (0%)
            fixture_rows("a", 3000, {512: 130.0, 768: 100.0, 1024: 110.0, 3000: 150.0}),
            # 2048 tokens, ring window 512: 1024 and the rule (1024) are cut to 512 -> 120 vs best 256 at 80 (50%)
            fixture_rows("b", 2048, {128: 90.0, 256: 80.0, 512: 120.0}, window=512, layout="ring"),
        ]
    )
    s = summarize_configs(df).set_index("config_key")
    assert s.loc["a", "best_chunk"] == 768 and s.loc["a", "regret_1024"] == pytest.approx(0.10)
    assert s.loc["a", "rule_chunk"] == 768 and s.loc["a", "regret_rule"] == 0
    assert s.loc["a", "worst_over_best"] == pytest.approx(1.5)
    assert s.loc["b", "best_chunk"] == 256 and s.loc["b", "chunk_1024"] == 512
    assert s.loc["b", "regret_1024"] == pytest.approx(0.5) and s.loc["b", "regret_rule"] == pytest.approx(0.5)


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    monkeypatch.chdir(tmp_path)  # artifacts go under ./mlruns
    return tmp_path


@pytest.mark.slow  # a real profile
def test_tiny_spec_runs_and_logs_to_mlflow(tmp_path, mlflow_store, capsys):
    spec = write_spec(tmp_path, TINY)
    out = tmp_path / "ttft"
    assert main(["profile", "--spec", str(spec), "--out", str(out)]) == 0
    df = read_dataset(out / "tiny")
    assert df.groupby("config_key").size().to_dict() == {
        c.key: len(c.candidates(tuple(TINY["chunk_sizes"]))[0]) for c in Spec.from_dict(TINY).configs
    }
    assert (df.repeats >= 2).all() and df.hardware_id.nunique() == 1 and (df.matmul_gflops > 0).all()
    # each row: the prompt's own FLOPs over its prefill, beside the peak this process reached; not compiled
    assert (df.prefill_gflops > 0).all() and (df.matmul_peak_gflops > 0).all() and not df.compiled.any()
    assert df.prefill_gflops.to_numpy() == pytest.approx(prefill_flops(df) / 1e9 / (df.prefill_ms.to_numpy() / 1e3))
    assert (df.attn_impl == "split").all() and (df.harness_version == HARNESS_VERSION).all()
    printed = capsys.readouterr()
    assert "4 configs measured" in printed.out and "ring layout needs chunk <= window" in printed.err
    import mlflow

    runs = mlflow.search_runs(experiment_names=["profiling"])
    assert len(runs) == 1 and runs["metrics.rows_written"][0] == len(df)
    inputs = mlflow.get_run(runs.run_id[0]).inputs.dataset_inputs
    assert inputs[0].dataset.name == "tiny"
    # a plain rerun finds everything done and measures nothing
    assert main(["profile", "--spec", str(spec), "--out", str(out), "--no-mlflow"]) == 0
    assert "0 configs measured" in capsys.readouterr().out and len(read_dataset(out / "tiny")) == len(df)


@pytest.mark.slow  # a real profile
def test_an_unreachable_tracking_server_costs_no_measurement(tmp_path, monkeypatch, capsys):
    from cli.processes import free_port

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens
    spec = write_spec(tmp_path, TINY)
    assert main(["profile", "--spec", str(spec), "--out", str(tmp_path / "ttft")]) == 0
    said = capsys.readouterr().err
    assert "opening a profiling run on http://127.0.0.1:" in said and "next run publishes them" in said
    assert read_dataset(tmp_path / "ttft" / "tiny").config_key.nunique() == len(Spec.from_dict(TINY).configs)


@pytest.mark.slow  # a real profile
def test_sweep_killed_at_random_moments_resumes_exactly(tmp_path):
    """SIGKILL (parent and worker) at three random moments, some mid-write: every file left is
    readable, and the resumed sweep has exactly the spec's rows, none twice (each start costs ~10 s
    of imports and model building: three kills keep it to about a minute)."""
    import random

    spec_dict = {
        **TINY,
        "name": "killme",
        "repeats": 1,
        "sweeps": [{**TINY["sweeps"][0], "contexts": [24, 32, 40, 48, 56, 72]}],
    }
    spec = write_spec(tmp_path, spec_dict)
    out = tmp_path / "ttft"
    cmd = [sys.executable, "-m", "cli", "profile", "--spec", str(spec), "--out", str(out), "--no-mlflow"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    moments = random.Random(7)

    def finished() -> int:  # counted without finished_keys, which would clear the writer's temporaries
        return sum(1 for f in (out / "killme").rglob("*.parquet") if not f.name.startswith(".tmp-"))

    for _ in range(3):
        before = finished()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 120  # wait for the first new row, then a random extra moment
        while proc.poll() is None and time.monotonic() < deadline:
            if finished() > before:
                break
            time.sleep(0.01)
        time.sleep(moments.uniform(0, 0.5))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        read_dataset(out / "killme")  # every finished file reads back and validates
    subprocess.run(cmd, env=env, check=True, capture_output=True)  # the same command resumes
    df = read_dataset(out / "killme")
    expected = {c.key for c in Spec.from_dict(spec_dict).configs}
    assert set(df.config_key) == expected
    assert not df.duplicated(["config_key", "chunk_size"]).any()
    assert not list((out / "killme").rglob(".tmp-*"))


@pytest.mark.slow  # a real profile
def test_budget_mode_measures_what_fits_and_says_what_it_left_out(tmp_path, capsys):
    spec = write_spec(
        tmp_path, {**TINY, "name": "budget", "sweeps": [{**TINY["sweeps"][0], "contexts": [40, 100, 400, 1600]}]}
    )
    assert (
        main(
            ["profile", "--spec", str(spec), "--out", str(tmp_path / "ttft"), "--budget-minutes", "0.05", "--no-mlflow"]
        )
        == 0
    )
    out = capsys.readouterr().out
    measured = len(list((tmp_path / "ttft" / "budget").rglob("*.parquet")))
    assert (
        1 <= measured < 8 and f"{measured} configs measured" in out and f"{8 - measured} left out by the budget" in out
    )


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_bad_budget_is_one_line(tmp_path, capsys, value):
    spec = write_spec(tmp_path, TINY)
    assert main(["profile", "--spec", str(spec), "--budget-minutes", value]) == 2
    assert "budget_minutes: must be a number in (0, 10080]" in capsys.readouterr().err


@pytest.mark.slow  # a real profile
def test_check_repro_remeasures_in_a_fresh_process(tmp_path, capsys):
    spec = write_spec(tmp_path, TINY)
    out = tmp_path / "ttft"
    assert main(["profile", "--spec", str(spec), "--out", str(out), "--no-mlflow"]) == 0
    capsys.readouterr()
    assert main(["profile", "--spec", str(spec), "--out", str(out), "--check-repro", "--sample", "2"]) == 0
    printed = capsys.readouterr().out
    assert "reproducibility over 2 configs re-measured in a fresh process" in printed
    assert len([line for line in printed.splitlines() if line.startswith("[")]) == 2  # one line per config


def test_repro_comparison_counts_ties_within_the_noise():
    from profiler.repro import repro_row

    same = repro_row("k", {64: 10.0, 128: 12.0}, {64: 11.0, 128: 13.0}, {64: 0.01, 128: 0.01})
    assert same.agrees and not same.tie and same.ratio == pytest.approx((1.1 + 13 / 12) / 2)
    tie = repro_row("k", {64: 10.0, 128: 10.1}, {64: 10.1, 128: 10.0}, {64: 0.01, 128: 0.01})
    assert tie.agrees and tie.tie
    flip = repro_row("k", {64: 10.0, 128: 12.0}, {64: 14.0, 128: 10.0}, {64: 0.01, 128: 0.01})
    assert not flip.agrees


def test_time_model_learns_flops_and_per_call_cost():
    from profiler.plan import TimeModel

    model = TimeModel()
    config = Spec.from_dict(TINY).configs[0]
    for flops, calls in [(1e9, 10), (4e9, 10), (1e9, 100), (8e9, 50)]:
        model.learn(config, (flops, calls), flops * 2e-11 + calls * 3e-3)  # a made-up machine
    assert model.seconds(config, (2e9, 20)) == pytest.approx(2e9 * 2e-11 + 20 * 3e-3, rel=0.01)


def test_a_noisy_config_is_remeasured_only_while_the_budget_lasts():
    from profiler.measure_config import EnginePool, measure_config

    spec = Spec.from_dict({**TINY, "cv_threshold": 1e-9})  # every config counts as noisy
    config = spec.configs[0]
    pool, hardware = EnginePool("cpu"), {"hardware_id": "test", "device": "cpu"}
    unbounded = measure_config(pool, config, spec, hardware)
    assert unbounded.remeasured.iloc[0] == spec.max_remeasure
    spent = measure_config(pool, config, spec, hardware, deadline=time.time())
    assert spent.remeasured.iloc[0] == 0 and spent.noisy.all()  # kept, and still marked noisy


def test_the_summary_scores_fixed_1024_and_the_rule_as_training_does_on_the_same_data():
    """One scorer: a size no config measured lands on the measured one below it, in the profiler's
    summary as in training's held-out table, so their regrets agree config by config."""
    from judge.metrics import records
    from training.baselines import FixedSpec
    from training.data import load_table

    machine = sorted((Path(__file__).resolve().parents[1] / "data" / "ttft" / "cpu-shipped").iterdir())[0]
    summary = summarize_configs(read_dataset(machine)).set_index("config_key")
    table = load_table(machine, older_engines=True)  # the summary scores every row
    keys = table.rows.drop_duplicates("group").set_index("group").config_key
    for policy, column in (
        (FixedSpec("hand-rule", "rule"), "regret_rule"),
        (FixedSpec("fixed-1024", "1024"), "regret_1024"),
    ):
        scored = records(table.rows, policy.choose(table))
        regret = (scored.ttft_chosen / scored.ttft_best - 1).to_numpy()
        assert summary.loc[keys[scored.group].to_numpy(), column].to_numpy() == pytest.approx(regret)
    assert summary.regret_rule.notna().all() and len(summary) == len(keys)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="other work is read from Linux's /proc")
def test_foreign_load_counts_other_processes_and_not_this_process_s_children():
    """A process outside this one's tree spinning beside the block is other work, in cores; a child
    of this process spinning is this process's own (its ticks are counted as ours, live or reaped)."""
    from engine.contention import _TICK_S, ForeignLoad, _own_ticks

    loop = "import time; t = time.time(); [0 for _ in iter(lambda: time.time() - t < 1.5, False)]"
    spin = f"{sys.executable} -c '{loop}'"
    subprocess.run(["sh", "-c", f"{spin} >/dev/null 2>&1 &"], check=True)  # its shell exits: not our child
    with ForeignLoad() as load:
        time.sleep(1.0)
    assert load.cores is not None and load.cores > 0.3
    before = _own_ticks()
    subprocess.run(["sh", "-c", spin], check=True)  # our child: 1.5 s of spinning
    assert (_own_ticks() - before) * _TICK_S > 0.3


def scripted_load(loads: list[float]) -> type:
    """A stand-in for engine.contention.ForeignLoad (unit tests): each block reads the first of
    `loads` as other work's cores and takes it off (a test refills the list for the next blocks)."""

    class Scripted:
        def __enter__(self):
            self.cores = None
            return self

        def __exit__(self, *exc):
            self.cores = loads.pop(0)

    return Scripted


def test_descriptors_measured_beside_other_work_are_taken_again_and_never_cached(monkeypatch, tmp_path, capsys):
    """The measurement and the other work are faked here (unit test): a machine measured beside
    other work reads slow (a third of its GFLOP/s), so it is measured again; the quiet measurement
    is cached, and one contended every time serves its process uncached, saying so."""
    import engine.hardware as hardware

    loads, gflops = [1.5, 0.02], iter([70.0, 210.0])

    monkeypatch.setattr(hardware, "ForeignLoad", scripted_load(loads))
    monkeypatch.setattr(hardware, "measure_descriptors", lambda *a: {"matmul_gflops": next(gflops)})
    monkeypatch.setenv("CHUNKPILOT_CONTENDED_CORES", "0.25")
    assert hardware.descriptors(tmp_path, "float32", 2)["matmul_gflops"] == 210.0
    (cached,) = tmp_path.glob("*.json")
    assert json.loads(cached.read_text()) == {"float32/2": {"matmul_gflops": 210.0}}

    loads[:], gflops = [1.5] * hardware.TRIES, iter([70.0, 71.0, 72.0])
    assert hardware.descriptors(tmp_path, "float32", 1)["matmul_gflops"] == 72.0
    assert "not cached" in capsys.readouterr().err
    assert list(json.loads(cached.read_text())) == ["float32/2"]


def test_a_config_timed_beside_other_work_is_measured_again_and_training_leaves_it_out(monkeypatch, tmp_path, capsys):
    """The other work is faked here (unit test): the first passes ran beside 1.5 cores of it, the next
    on a quiet machine; those replace the first and the rows carry the quiet figure. A config still
    beside it when no remeasure is left keeps its figure, and training (and the machine's best single
    size) leaves its rows out, saying so."""
    import profiler.measure_config as measuring
    from store.dataset import anchor_configs, contended
    from training.data import load_table

    loads = [1.5, 0.02]

    monkeypatch.setattr(measuring, "ForeignLoad", scripted_load(loads))
    monkeypatch.setenv("CHUNKPILOT_CONTENDED_CORES", "0.25")  # the default (the suite's own is lifted)
    spec = Spec.from_dict({**TINY, "cv_threshold": 9.0, "max_remeasure": 1})  # never noisy
    config = spec.configs[0]
    pool, hardware = measuring.EnginePool("cpu"), {"hardware_id": "test", "device": "cpu"}
    quiet = measuring.measure_config(pool, config, spec, hardware)
    assert quiet.remeasured.iloc[0] == 1 and (quiet.foreign_cores == 0.02).all() and not contended(quiet).any()
    assert (quiet.repeats == spec.repeats).all()  # the passes beside other work were dropped, not added to
    loads[:] = [1.5, 1.2]
    busy = measuring.measure_config(pool, config, spec, hardware)
    assert busy.remeasured.iloc[0] == 1 and (busy.foreign_cores == 1.2).all() and contended(busy).all()

    for key, n in (("a", 2048), ("b", 3000), ("c", 4096)):
        rows = fixture_rows(key, n, {512: 100.0, 1024: 90.0}).assign(foreign_cores=1.2 if key == "c" else 0.01)
        write_config(tmp_path, key, rows)
    table = load_table(tmp_path, older_engines=True)
    assert set(table.rows.config_key) == {"a", "b"}
    assert "left out 2 rows timed beside other work (2 on abc)" in capsys.readouterr().err
    every = read_dataset(tmp_path)
    assert sum(len(configs) for configs in anchor_configs(every.assign(harness_version=HARNESS_VERSION)).values()) == 2
