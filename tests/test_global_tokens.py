"""Selective SWA from the user's side: which tokens become global (positions, token ids, text
markers), the engine's result against one reference forward, the request's count as a feature,
and a profiling spec that sweeps it (the cache-level exactness is in test_exactness.py)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT
from reference import reference_logits

from chunkpilot.chunks import spread_positions
from chunkpilot.contract import MAX_GLOBAL_TOKENS, AttentionConfig, ChunkRequest, ConfigError
from chunkpilot.features import FEATURES, build
from cli import main
from engine.global_tokens import GlobalTokens
from engine.policy import FixedPolicy
from engine.workload import Workload
from profiler.spec import Spec

TEXT = "Context: windows slide. " * 30 + "Question: what is kept? " + "More context follows here. " * 30


def test_positions_ids_and_markers_resolve_against_the_prompt(engines):
    tokenizer = engines("llama-tiny").tokenizer
    ids = tokenizer.encode(TEXT).ids
    spec = GlobalTokens.parse(["0,5", "99999", "text:Question:", f"id:{ids[3]}"])
    positions = spec.resolve(ids, lambda text: tokenizer.encode(text).ids)
    marker = [tuple(tokenizer.encode(m).ids) for m in ("Question:", " Question:")]
    k = next(len(m) for m in marker if any(tuple(ids[i : i + len(m)]) == m for i in range(len(ids))))
    start = next(i for i in range(len(ids)) if tuple(ids[i : i + k]) in marker)
    assert {0, 5, *range(start, start + k)} <= set(positions) and 99999 not in positions  # beyond the prompt
    assert {i for i, t in enumerate(ids) if t == ids[3]} <= set(positions) and positions == sorted(positions)


@pytest.mark.parametrize("values", [["1,x"], ["id:-3"], ["id:"], ["-1"]])
def test_a_bad_global_token_names_the_field(values):
    with pytest.raises(ConfigError, match="global_tokens"):
        GlobalTokens.parse(values)


def test_too_many_global_tokens_are_refused():
    with pytest.raises(ConfigError, match=f"global_tokens: at most {MAX_GLOBAL_TOKENS}"):
        GlobalTokens(positions=tuple(range(MAX_GLOBAL_TOKENS + 1))).resolve([0] * 2000, lambda t: [])
    with pytest.raises(ConfigError, match="global_tokens: needs a window"):
        AttentionConfig(global_tokens=4)


@pytest.mark.parametrize("layout", ["shift", "ring"])
def test_the_engine_s_marker_tokens_stay_visible_like_the_reference(engines, layout):
    engine = engines("gemma3-interleaved")
    attention = AttentionConfig(window=32, layout=layout, sinks=2)
    spec = GlobalTokens.parse(["text:Question:", "3"])
    result = engine.run(Workload(None, attention, spec, TEXT), FixedPolicy(32))
    ids = engine.tokenizer.encode(TEXT).ids
    positions = spec.resolve(ids, lambda text: engine.tokenizer.encode(text).ids)
    assert result.global_tokens == len(positions) > 1
    full = torch.tensor([[*ids, result.first_token]])
    ref = reference_logits(engine.model, engine.shape, full, 32, 2, "sdpa", tuple(positions))
    torch.testing.assert_close(result.first_logits, ref[len(ids) - 1], atol=1e-4, rtol=0)
    plain = engine.run(Workload(None, attention, text=TEXT), FixedPolicy(32))  # the same prompt, no global tokens
    assert not torch.allclose(plain.first_logits, result.first_logits, atol=1e-3)  # they matter


def test_a_count_alone_spreads_the_tokens_and_is_a_feature(engines):
    engine = engines("llama-tiny")
    n, attention = 600, AttentionConfig(window=64, global_tokens=8)
    assert spread_positions(8, n) == [66, 133, 200, 266, 333, 400, 466, 533]
    result = engine.run(Workload(n, attention), FixedPolicy(128))
    assert result.global_tokens == 8
    hardware = {"matmul_gflops": 100.0, "bandwidth_gbs": 10.0, "call_overhead_ms": 1.0, "cores": 2}
    request = ChunkRequest(context_length=n, model="llama-tiny", attention=attention, hardware=hardware)
    row = request.row(request.hardware.model_dump())
    more, none = (build({**row, "global_tokens": g, "chunk_size": [128]}) for g in (64, 0))
    at = FEATURES.index("attention_gflop")
    assert more[0, FEATURES.index("global_tokens")] == 64 and more[0, at] > none[0, at]  # the analytic cost grows
    assert ChunkRequest.from_row({**row, "family": "llama", "hardware_id": None}).attention.global_tokens == 8


def test_the_cli_reports_global_tokens_and_refuses_them_without_a_window(capsys):
    argv = ["prefill", "--model", "llama-tiny", "--prompt", TEXT, "--chunk-size", "64", "--repeats", "1", "--json"]
    assert main([*argv, "--window", "64", "--global-tokens", "text:Question:", "--global-tokens", "0,1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["attention"]["global_tokens"] >= 3
    assert main([*argv, "--global-tokens", "0,1"]) == 2
    err = capsys.readouterr().err
    assert "global_tokens: needs a window" in err and len(err.strip().splitlines()) == 1


def test_the_profiler_sweeps_global_tokens_without_moving_older_keys():
    spec = Spec.from_file(ROOT / "data/specs/global-tokens.yaml")
    counts = {c.global_tokens for c in spec.configs}
    assert counts == {0, 8, 64}
    keys = {
        c.global_tokens: c.key
        for c in spec.configs
        if c.context_length == 2048 and c.layout == "ring" and c.model == "llama-tiny"
    }
    assert "g64" in keys[64] and "g" not in keys[0].split("-w")[1].split("-")[0][1:]
    assert all(c.attention.global_tokens == c.global_tokens for c in spec.configs)
