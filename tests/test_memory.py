"""Memory is part of the choice: a prefill's peak above the loaded model is measured per size (and
agrees with a fresh process's), predicted for every candidate, and a request's memory_budget_mb
is kept (the fastest size predicted to fit) or refused naming the field and what would fit, the
same way whether the recipe is judged offline, served by the service or asked as an MLflow model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from chunkpilot.contract import ChunkRequest, ConfigError, Hardware
from chunkpilot.features import build
from engine.policy import FixedPolicy
from engine.workload import Workload
from estimator.decide import Infeasible
from estimator.memory import MIB, MIN_MARGIN, TERMS, MemoryModel, terms

HARDWARE = {"matmul_gflops": 250.0, "bandwidth_gbs": 40.0, "call_overhead_ms": 0.9, "cores": 2}
FRESH = textwrap.dedent(
    """
    import json, sys
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.memory import resident_peak_above
    from engine.policy import FixedPolicy
    from engine.workload import Workload
    engine = Engine(EngineConfig(model="llama-tiny", threads=int(sys.argv[2])))
    policy = FixedPolicy(int(sys.argv[1]))
    engine.run(Workload(2048), policy)  # this shape's one-time kernel buffers, as a running engine holds them
    resident = resident_peak_above(lambda: engine.run(Workload(2048), policy), engine.device)
    print(json.dumps([engine.prefill_memory(Workload(2048), policy), resident]))
    """
)


def fresh_process_peaks(chunk: int, threads: int) -> tuple[int, int]:
    """A fresh process that has run only this prefill once before: the allocator's peak, and the
    resident set's."""
    out = subprocess.run(
        [sys.executable, "-c", FRESH, str(chunk), str(threads)], capture_output=True, text=True, check=True
    )
    allocated, resident = json.loads(out.stdout.splitlines()[-1])
    return allocated, resident


def test_a_prefill_s_peak_is_exact_grows_with_its_chunk_and_the_resident_set_holds_it(engines):
    engine = engines("llama-tiny")
    workload = Workload(2048)
    small, whole = (engine.prefill_memory(workload, FixedPolicy(c)) for c in (128, 2048))
    assert whole > 1.5 * small > 0  # one shot holds the whole prompt's activations and scores at once
    assert engine.prefill_memory(workload, FixedPolicy(128)) == small  # the allocator's count: exact, every run
    for chunk, ours in ((128, small), (2048, whole)):
        allocated, resident = fresh_process_peaks(chunk, engine.runtime.threads)
        # what the engine ran before does not decide the reading: a fresh process counts the same bytes
        assert allocated == pytest.approx(ours, rel=0.01), (chunk, allocated, ours)
        # the tensors are resident; the resident set adds glibc's slack and the kernels' own buffers
        assert 0.9 * ours <= resident <= 3 * ours + 32 * MIB, (chunk, ours, resident)


def rows(n: np.ndarray, c: np.ndarray, **given: object) -> np.ndarray:
    config = {"window": 0, "layout": "none", "sinks": 0, "global_tokens": 0, "global_every": 0, "num_layers": 4}
    shape = {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 4, "head_dim": 64, "intermediate_size": 768}
    runtime = {"vocab_size": 4096, "parameters": 1e7, "dtype": "float32", "threads": 2, "attn_impl": "split"}
    return build(
        {**config, **shape, **runtime, **HARDWARE, "backend": "chunkpilot", "quant": None, "l2_cache_bytes": 0}
        | {"l3_cache_bytes": 0, "context_length": n, "chunk_size": c}
        | given
    )


def test_buffers_freed_before_others_exist_are_not_summed():
    """Unit test of the terms (no engine): llama.cpp's graph holds a batch's scores or its logits,
    never both; generate's peak is the chunk and phase holding the most, so a 4,096-token first
    chunk of 4,500 (no mask: causal) peaks in its MLP, and 128-token chunks in a late chunk's attention."""
    column = {name: i for i, name in enumerate(TERMS)}
    n = np.array([4500.0, 4500.0])
    llama = terms(rows(n, np.array([256.0, 4096.0]), backend="llama.cpp", attn_impl="masked"))
    scores = 4 * 4 * np.array([256, 4096]) * 4608 / MIB  # every head, a padded batch against every cell
    logits = 4 * np.array([256, 4096]) * 4096 / MIB
    assert llama[:, column["graph"]] == pytest.approx(np.maximum(scores, logits))
    assert (llama[:, [column["scores"], column["logits"]]] == 0).all()
    generate = terms(rows(n, np.array([4096.0, 128.0]), backend="transformers", attn_impl="masked"))
    assert generate[0, column["mask"]] == 0 < generate[0, column["mlp"]]
    assert generate[1, column["mlp"]] == 0 < generate[1, column["mask"]]
    assert (generate[:, column["scores"]] == 0).all()  # sdpa's CPU kernel scores a block at a time
    ring = {"window": 1024, "layout": "ring", "global_every": 0}
    plain, sunk = (terms(rows(n[:1], np.array([64.0]), **ring, sinks=s)) for s in (0, 4))
    assert plain[0, column["prepended"]] == 0 < sunk[0, column["prepended"]]  # the sinks' concatenation copies


def test_split_holds_a_mask_only_where_it_attends_in_one_call_and_blocks_elsewhere():
    """Unit test of the terms (no engine): split attends a shift window's chunk of half of it or
    less in one call with the step's mask [chunk, window + chunk], held through the step (so in the
    MLP's phase too); a larger chunk goes in blocks (each query's outputs held until merged) and no
    mask; a ring is put in position order, one layer's copy as it attends, and has no mask either."""
    column = {name: i for i, name in enumerate(TERMS)}
    n = np.full(2, 6000.0)
    # a narrow MLP, so that the attention's phase holds the peak
    shift = terms(rows(n, np.array([1024.0, 1536.0]), window=2048, layout="shift", intermediate_size=64))
    assert shift[0, column["mask"]] == pytest.approx(4 * 1024 * (2048 + 1024) / MIB)
    assert shift[0, column["blocks"]] == 0 < shift[1, column["blocks"]] and shift[1, column["mask"]] == 0
    ring = terms(rows(n[:1], np.array([512.0]), window=1024, layout="ring"))
    assert ring[0, column["mask"]] == 0 < ring[0, column["reordered"]]
    plain = terms(rows(n[:1], np.array([512.0])))  # no window: in position order already
    assert plain[0, column["reordered"]] == 0 == plain[0, column["mask"]]


def test_the_memory_model_recovers_the_buffers_a_prefill_holds():
    """Unit test on synthetic peaks built from known coefficients (no engine): the fit finds them,
    predicts a config it never saw, and its margin is the floor when the held-out configs fit exactly."""
    rng = np.random.default_rng(0)
    n = rng.integers(500, 9000, 60).astype(float)
    c = np.minimum(rng.choice([128, 256, 512, 1024, 2048], 60), n)
    x = rows(n, c)
    # a constant, KV, activations, scores, mask
    truth = np.array([12.0, 1.0, 0.0, 3.0, 2.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    model = MemoryModel().fit(x, terms(x) @ truth * MIB, np.arange(60) // 3)
    unseen = rows(np.array([6000.0]), np.array([768.0]))
    assert model.predict_bytes(unseen)[0] == pytest.approx((terms(unseen) @ truth)[0] * MIB, rel=1e-3)
    assert model.margin == MIN_MARGIN == model.margin_of(unseen)[0] and len(TERMS) == len(truth)
    budget = model.predict_bytes(unseen)[0] * (1 + MIN_MARGIN) / MIB
    assert model.fits(unseen, budget * 1.001)[0] and not model.fits(unseen, budget * 0.999)[0]
    few = MemoryModel().fit(x[:6], terms(x[:6]) @ truth * MIB, np.arange(6) // 3)  # two configs: every row's fit
    assert few.coefficients == {} and few.predict_bytes(unseen)[0] > 0


@pytest.fixture(scope="module")
def served(trained_store):
    from predictor.model import load_predictor
    from store.registry import CHAMPION, MODEL_NAME

    predictor = load_predictor(trained_store, MODEL_NAME, CHAMPION)
    yield predictor
    predictor.close()


def test_a_budget_takes_the_fastest_size_predicted_to_fit(served):
    """The small dataset's profile measured its peaks, so the champion predicts every candidate's:
    under a budget between the smallest and the largest, the answer is a size that fits with the
    margin, the fastest predicted of those, and every size it offers fits too."""
    request = ChunkRequest(context_length=3000, model="llama-tiny", threads=2, hardware=Hardware(**HARDWARE))
    free = served.exact_answer(request)  # the recipe at this length: every candidate priced
    peaks = {c.chunk_size: c.predicted_peak_mb for c in free.candidates}
    margin = free.memory_margin
    assert margin >= MIN_MARGIN and all(p > 0 for p in peaks.values())
    assert peaks[3000] > peaks[min(peaks)]  # one shot holds more than the smallest chunk
    budget = (peaks[min(peaks)] + peaks[3000]) / 2 * (1 + margin)
    answer = served.answer(request.model_copy(update={"memory_budget_mb": budget}))
    fitting = [c for c in answer.candidates if c.predicted_peak_mb * (1 + margin) <= budget]
    assert peaks[answer.chunk_size] * (1 + margin) <= budget < peaks[3000] * (1 + margin)
    assert answer.source == "model" and all(c.chunk_size in {f.chunk_size for f in fitting} for c in answer.top)
    fastest = min(fitting, key=lambda c: c.predicted_ttft_ms).chunk_size
    assert answer.chunk_size == fastest or (answer.deferred and answer.chunk_size == answer.anchor.chunk_size)


def test_a_schedule_asked_with_a_budget_holds_no_chunk_above_the_largest_size_that_fits(served, known_machine):
    # the profiled machine: the model schedules only a kind it knows (elsewhere the anchor's plan runs)
    request = ChunkRequest(context_length=3000, model="llama-tiny", threads=2, hardware=Hardware(**known_machine))
    free = served.exact_answer(request)
    peaks, margin = {c.chunk_size: c.predicted_peak_mb for c in free.candidates}, free.memory_margin
    budget = (peaks[min(peaks)] + peaks[3000]) / 2 * (1 + margin)
    fitting = [size for size, peak in peaks.items() if peak * (1 + margin) <= budget]
    answer = served.answer(request.model_copy(update={"memory_budget_mb": budget, "schedule": True}))
    assert answer.schedule is not None and sum(answer.schedule) == 3000 and max(answer.schedule) <= max(fitting)


def test_a_budget_no_size_fits_is_refused_naming_the_field_and_what_would_fit(served):
    request = ChunkRequest(context_length=3000, model="llama-tiny", threads=2, hardware=Hardware(**HARDWARE))
    smallest = min(c.predicted_peak_mb for c in served.exact_answer(request).candidates)
    with pytest.raises(Infeasible, match=r"^memory_budget_mb: .*smallest predicted peak is") as refused:
        served.answer(request.model_copy(update={"memory_budget_mb": smallest / 2}))
    assert refused.value.reason == "over_memory_budget"


def test_judged_offline_served_and_the_mlflow_model_agree_under_a_budget(served, trained_store):
    """The offline judge (training/memory.py asks Recipe.decide), the service's answer and the
    registered MLflow model make one choice for each budget, refusals included."""
    import mlflow
    import pandas as pd

    request = ChunkRequest(context_length=2500, model="llama-tiny", threads=2, hardware=Hardware(**HARDWARE))
    peaks = sorted(c.predicted_peak_mb for c in served.exact_answer(request).candidates)
    mlflow.set_tracking_uri(trained_store)
    model = mlflow.pyfunc.load_model("models:/chunk-size-predictor@champion")
    for budget in (peaks[0] / 2, peaks[0] * 1.2, peaks[len(peaks) // 2] * 1.2, peaks[-1] * 2):
        asked = request.model_copy(update={"memory_budget_mb": budget})
        try:
            judged = served.recipe.decide(asked)
        except Infeasible:
            with pytest.raises(Infeasible, match="memory_budget_mb"):
                served.answer(asked)
            continue
        size = judged.chunk_size
        assert served.answer(asked).chunk_size == size
        row = {**json.loads(asked.model_dump_json()), "hardware": HARDWARE}
        assert model.predict(pd.DataFrame([row])).chunk_size.iloc[0] == size


def test_the_engine_refuses_a_prefill_its_budget_cannot_hold(trained_store, engines):
    from auto.client import InProcessPolicy
    from engine.workload import Workload as W

    engine = engines("llama-tiny")
    policy = InProcessPolicy(trained_store, engine.hardware())
    request = engine.request(2000, W(2000).attention).model_copy(update={"memory_budget_mb": 0.001})
    with pytest.raises(ConfigError, match="memory_budget_mb") as refused:
        policy.decide(request)
    assert "smallest predicted peak" in str(refused.value)
    policy.close()
