"""Compiled forests (estimator.forest): the members' trees as native code predict what LightGBM
predicts, are compiled once per machine and model, and the service swaps them in behind its answers."""

from __future__ import annotations

import subprocess
import sys

import lightgbm as lgb
import numpy as np
import pytest

from chunkpilot.contract import ChunkRequest
from estimator.forest import BUSY, Forest, fused_text


def boosters(members: int = 3, rounds: int = 25, seed: int = 0) -> list[lgb.Booster]:
    """Small real boosters on a noisy function of 6 features; the last member's target is constant,
    so it stops early (nothing left to split) with fewer trees than the others."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 100, size=(400, 6))
    y = np.log1p(x[:, 0] * x[:, 1]) + np.sin(x[:, 2] / 10) + rng.normal(0, 0.1, 400)
    params = {"verbose": -1, "num_threads": 1, "deterministic": True, "num_leaves": 15, "min_data_in_leaf": 5}
    out = [
        lgb.train({**params, "seed": k, "bagging_fraction": 0.8, "bagging_freq": 1}, lgb.Dataset(x, y), rounds)
        for k in range(members - 1)
    ]
    out.append(lgb.train({**params, "seed": 9}, lgb.Dataset(x, np.ones(len(x))), rounds))
    return out


def test_the_members_are_the_classes_of_one_model_padded_to_as_many_trees_each():
    members = boosters()
    trees = [b.num_trees() for b in members]
    assert trees[-1] < trees[0]  # stopped early: padded with empty trees
    text = fused_text(members)
    assert f"num_class={len(members)}" in text and f"num_tree_per_iteration={len(members)}" in text
    assert text.count("\nTree=") == len(members) * max(trees)


def test_compiled_predictions_equal_lightgbms_and_compile_once_per_forest(tmp_path):
    members = boosters()
    forest = Forest(members)
    x = np.random.default_rng(1).uniform(-10, 110, size=(57, 6))  # beyond the training range too
    before = forest.predict(x)  # [members, rows]: LightGBM's own
    assert before.shape == (3, 57)

    forest.compile(tmp_path)
    assert np.allclose(forest.predict(x), before, rtol=0, atol=1e-12)
    assert len(list(tmp_path.glob("*.o"))) == 1

    again = Forest(members)
    again.compile(tmp_path)  # read from the cache: no second object file
    assert np.allclose(again.predict(x), before, rtol=0, atol=1e-12)
    assert len(list(tmp_path.glob("*.o"))) == 1
    Forest(boosters(seed=1)).compile(tmp_path)  # other trees: their own file
    assert len(list(tmp_path.glob("*.o"))) == 2
    assert not list(tmp_path.glob(".*"))  # no half-written file left behind


def test_a_served_recipe_decides_the_same_with_compiled_forests(trained_store, tmp_path, monkeypatch):
    """Judged == served: the service compiles in the background and its decisions stay the recipe's,
    to the last digit of every candidate's predicted TTFT; what deciding costs (the budget's measure)
    is measured again on them."""
    from predictor.model import load_predictor

    monkeypatch.setenv("CHUNKPILOT_CACHE_DIR", str(tmp_path))
    plain = load_predictor(trained_store, "chunk-size-predictor", "champion", compiled=False)
    compiled = load_predictor(trained_store, "chunk-size-predictor", "champion", compiled=True)
    at_load = compiled.decision_ms  # the smoke request's, on LightGBM's predictor
    compiled.forests.join(300)
    assert compiled.compile_s is not None and plain.compile_s is None
    # the decision budget weighs what a decision costs now: measured again on the compiled forests
    assert 0 < compiled.decision_ms != at_load
    machine = {"hardware_id": next(iter(plain.recipe.hardware))}
    for n, window in [(700, None), (3000, None), (5000, 1024), (9000, 2048)]:
        ask = ChunkRequest(
            context_length=n, model="llama-tiny", hardware=machine, attention={"window": window, "layout": "shift"}
        )
        a, b = plain.exact_answer(ask), compiled.exact_answer(ask)
        assert a.chunk_size == b.chunk_size
        assert [c.predicted_ttft_ms for c in a.candidates] == pytest.approx(
            [c.predicted_ttft_ms for c in b.candidates], rel=1e-9
        )
    plain.close()
    compiled.close()


def test_a_forest_of_one_member_predicts_one_row_of_members(tmp_path):
    (member,) = boosters(members=2)[:1]
    forest = Forest([member])
    x = np.random.default_rng(2).uniform(0, 100, size=(9, 6))
    before = forest.predict(x)
    forest.compile(tmp_path)
    assert before.shape == forest.predict(x).shape == (1, 9)
    assert np.allclose(forest.predict(x), before, rtol=0, atol=1e-12)


def test_a_forest_compiles_in_one_process_at_a_time_from_trees_that_outlive_the_asker(tmp_path):
    """The compiler reads the trees from beside their object, not from the asking process's
    temporary folder, so a short-lived asker (a CLI run) that exits mid-compile still leaves the
    object for the next. While another live process holds a key's lock, a compiler of that key
    compiles nothing (the asker waits for that object); a lock whose process is gone is taken over."""
    members = boosters()
    Forest(members).compile(tmp_path)
    (cached,) = tmp_path.glob("*.o")
    trees = cached.with_suffix(".txt")
    assert trees.is_file() and not cached.with_suffix(".lock").exists()
    for done in (cached, cached.with_suffix(".sha256")):
        done.unlink()
    compiler = [sys.executable, "-m", "estimator.forest", str(trees), str(cached)]
    holder = subprocess.Popen(["sleep", "60"])  # another process, compiling this key as far as its lock says
    try:
        cached.with_suffix(".lock").write_text(str(holder.pid))
        assert subprocess.run(compiler, capture_output=True, check=False).returncode == BUSY
        assert not cached.exists()
    finally:
        holder.kill()
        holder.wait()
    assert subprocess.run(compiler, capture_output=True, check=False).returncode == 0  # a dead holder's lock
    assert cached.is_file() and not cached.with_suffix(".lock").exists()
    x = np.random.default_rng(4).uniform(0, 100, size=(9, 6))
    forest = Forest(members)
    forest.compile(tmp_path)
    assert forest.compiled is not None
    assert np.allclose(forest.predict(x), Forest(members).predict(x), rtol=0, atol=1e-12)


def test_a_damaged_cached_object_is_compiled_again_never_loaded(tmp_path):
    """LLVM aborts the process that loads a damaged object: the digest beside it is checked first."""
    members = boosters()
    Forest(members).compile(tmp_path)
    (cached,) = tmp_path.glob("*.o")
    good = cached.read_bytes()
    cached.write_bytes(good[: len(good) // 2])  # a disk that filled up, a stray write
    forest = Forest(members)
    x = np.random.default_rng(3).uniform(0, 100, size=(20, 6))
    forest.compile(tmp_path)
    assert np.allclose(forest.predict(x), Forest(members).predict(x), rtol=0, atol=1e-12)
    assert cached.read_bytes() == good  # checked in a child process, then cached again
