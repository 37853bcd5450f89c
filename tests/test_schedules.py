"""Chunk schedules chosen by the champion's per-chunk cost model: asked with `"schedule": true`, the
service answers sizes in order that fit the layout and sum to the prompt, predicted no slower than
the TTFT model's best sizes run uniformly (its own pick among them); the engine runs them with the
same first token."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from servers import serve

from auto.client import AutoPolicy, InProcessPolicy, ask
from chunkpilot.chunks import max_chunk, uniform
from chunkpilot.contract import AttentionConfig, ChunkRequest, Hardware
from chunkpilot.features import build
from engine.policy import FixedPolicy
from engine.workload import Workload
from estimator.decide import resolve_hardware
from estimator.schedule import search_steps
from predictor.app import create_app
from predictor.model import load_predictor
from predictor.settings import Settings
from store.registry import CHAMPION, MODEL_NAME


@pytest.fixture(scope="module")
def machine(known_machine) -> Hardware:
    """The profiled machine: the model schedules only where it knows the kind (elsewhere the anchor's
    uniform plan runs)."""
    return Hardware(**known_machine)


ATTENTION = [{"window": None}, {"window": 512}, {"window": 256, "layout": "ring"}]


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("n", [300, 2000, 5000])
def test_the_schedule_fits_and_is_never_predicted_slower_than_a_uniform_size(trained_store, machine, n, attention):
    predictor = load_predictor(trained_store, MODEL_NAME, CHAMPION)
    assert predictor.info["schedules"]  # the small dataset has per-chunk times
    request = ChunkRequest(context_length=n, model="llama-tiny", attention=attention, hardware=machine, schedule=True)
    answer = predictor.answer(request)
    att = request.attention
    att.check_schedule(answer.schedule, n)  # sizes that fit the layout, summing to the prompt
    hw = resolve_hardware(predictor.recipe.hardware, request.hardware, request.dtype, request.threads)
    config = build({**request.row(hw), "chunk_size": [n]})

    def predicted(schedule: list[int]) -> float:
        h = np.cumsum([0, *schedule[:-1]]).astype(float)
        return float(predictor.recipe.chunk_ms(np.repeat(config, len(schedule), 0), np.array(schedule, float), h).sum())

    ranked = [answer.chunk_size, *(c.chunk_size for c in answer.top if c.chunk_size != answer.chunk_size)]
    uniform_sizes, _ = search_steps(ranked, n, max_chunk(n, att.window, att.layout))
    assert answer.chunk_size in uniform_sizes or answer.chunk_size >= n
    assert all(predicted(answer.schedule) <= predicted(uniform(n, c)) * (1 + 1e-9) for c in uniform_sizes)
    assert predictor.answer(request.model_copy(update={"schedule": False})).schedule is None  # only when asked


def test_auto_runs_the_answered_schedule_with_the_same_first_token(trained_store, machine, engines, tmp_path):
    engine = engines("llama-tiny")
    n, attention = 700, AttentionConfig(window=128, layout="ring")
    workload = Workload(n, attention)
    app = create_app(Settings(tracking_uri=trained_store, poll_interval_s=0, telemetry_dir=tmp_path))
    with serve(app) as url:
        body = ask(engine.request(n, attention), machine, schedule=True)
        answered = httpx.post(f"{url}/v1/chunk-size", json=body.model_dump(mode="json")).json()["schedule"]
        policy = AutoPolicy(url, 2.0, machine, schedule=True)
        served = engine.run(workload, policy)
        again = engine.run(workload, policy)  # from the client's cache, schedule and all
        policy.close()
    in_process = InProcessPolicy(trained_store, machine, schedule=True)
    local = engine.run(workload, in_process)
    plain = engine.run(workload, FixedPolicy(128))
    assert served.schedule == answered == local.schedule and served.decision.source == "service"
    assert again.decision.source == "cache" and again.schedule == answered
    assert served.num_chunks == len(answered) and max(answered) <= 128
    assert served.first_token == plain.first_token


def test_the_search_stays_small_for_any_request(trained_store, machine):
    """Steps and boundaries are capped, so an adversarial request (the longest prompt, one-token
    candidates) cannot make the service slow: it answers without a schedule when even the best
    size would need too many boundaries."""
    from estimator.schedule import MAX_BOUNDARIES

    predictor = load_predictor(trained_store, MODEL_NAME, CHAMPION)
    n = 1 << 20

    def ask(candidates):
        return predictor.answer(
            ChunkRequest(context_length=n, model="llama-tiny", hardware=machine, candidates=candidates, schedule=True)
        )

    assert ask([1, 3]).schedule is None
    assert set(ask([1 << 14, 1 << 15]).schedule) <= {1 << 15, n}  # 16k chunks would need 64 boundaries
    schedule = ask([n // 4, n // 8, 3 * n // 16]).schedule  # boundaries every 1/16 of the prompt
    assert sum(schedule) == n and len(schedule) <= MAX_BOUNDARIES
