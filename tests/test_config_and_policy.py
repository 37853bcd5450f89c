"""The shared light types and the chunk-size policies: validation messages and the hand rule."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from chunkpilot.chunks import chunk_count, hand_rule, last_chunk
from chunkpilot.contract import PRESETS, AttentionConfig, ChunkRequest, ConfigError, Hardware, ModelShape
from engine.policy import FixedPolicy, FullPolicy, RulePolicy, parse_policy


@pytest.mark.parametrize(
    ("tokens", "chunk"),
    [
        (1, 512),
        (512, 512),
        (513, 1024),
        (1536, 1024),
        (1537, 768),
        (2048, 1024),
        (3000, 768),
        (4096, 1024),
        (5000, 768),
    ],
)
def test_hand_rule_of_the_write_up(tokens, chunk):
    assert hand_rule(tokens) == chunk


def request(n: int, attention: AttentionConfig) -> ChunkRequest:
    return ChunkRequest(n, PRESETS["mistral-44m"], attention, hardware=Hardware(hardware_id="0123456789ab"))


def test_chunk_arithmetic_is_one_formula_for_ints_floats_and_columns():
    assert (chunk_count(3000, 768), last_chunk(3000, 768)) == (4, 696)
    assert (chunk_count(1024, 512), last_chunk(1024, 512)) == (2, 512)  # a size that divides: a full last chunk
    n, c = np.array([3000.0, 1024.0, 1.0]), np.array([768.0, 512.0, 64.0])  # the features' float columns
    assert chunk_count(n, c).tolist() == [4.0, 2.0, 1.0] and last_chunk(n, c).tolist() == [696.0, 512.0, 1.0]
    lengths = np.arange(1, 5000)
    assert (chunk_count(lengths * 1.0, 384.0) == np.ceil(lengths / 384)).all()  # exact where n / c would round


def test_the_dataset_s_no_window_is_read_in_one_place():
    assert AttentionConfig.from_columns(0, "none") == AttentionConfig()  # the dataset's spelling
    assert AttentionConfig.from_columns(None, "none").row_layout == "none"  # and back
    assert AttentionConfig.from_columns(512, "ring", 4, 8) == AttentionConfig(512, "ring", 4, 8)
    assert AttentionConfig(512, "ring", 4).label == "w512 ring s4" and AttentionConfig().label == "no window"


def test_rule_is_always_feasible_so_it_can_be_the_fallback():
    assert RulePolicy().decide(request(3000, AttentionConfig(window=256, layout="ring"))).chunk_size == 256
    assert RulePolicy().decide(request(300, AttentionConfig())).chunk_size == 300
    assert RulePolicy().decide(request(3000, AttentionConfig(window=256))).chunk_size == 768  # shift takes any


def test_fixed_and_full_respect_the_ring_rule():
    ring = AttentionConfig(window=512, layout="ring")
    assert FixedPolicy(512).decide(request(4096, ring)).chunk_size == 512
    with pytest.raises(ConfigError, match="chunk_size: ring layout needs chunk_size <= window"):
        FixedPolicy(513).decide(request(4096, ring))
    with pytest.raises(ConfigError, match="chunk_size"):
        FullPolicy().decide(request(4096, ring))
    assert FullPolicy().decide(request(500, ring)).chunk_size == 500


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "auto?", "", "True", "512,0", "512,", "256,x"])
def test_parse_policy_rejects(value):
    allowed = "chunk_size: must be a positive integer, 'full', 'rule', 'simple-rule' or sizes like"
    with pytest.raises(ConfigError, match=allowed):
        parse_policy(value)


def test_a_schedule_pattern_covers_any_prompt():
    decreasing = parse_policy("1024, 512,256")
    assert decreasing.decide(request(3000, AttentionConfig())).schedule == (1024, 512, 256, 256, 256, 256, 256, 184)
    assert decreasing.decide(request(700, AttentionConfig())).schedule == (700,)  # cut to the prompt
    decision = decreasing.decide(request(1300, AttentionConfig(window=1024, layout="ring")))
    assert decision.schedule == (1024, 276) and decision.chunk_size == 1024 and decision.source == "schedule"
    with pytest.raises(ConfigError, match="chunk_size: ring layout needs chunk_size <= window"):
        decreasing.decide(request(3000, AttentionConfig(window=512, layout="ring")))
    with pytest.raises(ConfigError, match="chunk_size: a schedule must sum to the prompt's 100 tokens; got 90"):
        AttentionConfig().check_schedule([64, 26], 100)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(window=0), "window"),
        (dict(sinks=2), "sinks"),
        (dict(layout="ring"), "layout"),
        (dict(window=8, layout="circle"), "layout"),
        (dict(window=8, sinks=-1), "sinks"),
    ],
)
def test_attention_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        AttentionConfig(**kwargs)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(family="gpt2"), "family"),
        (dict(num_kv_heads=3), "num_kv_heads"),
        (dict(hidden_size=250, head_dim=None), "hidden_size"),
        (dict(num_layers="eight"), "num_layers"),
        (dict(window=0), "window"),
        (dict(global_every=13), "global_every"),
    ],
)
def test_model_shape_names_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        ModelShape(**{**PRESETS["gemma3-interleaved"].model_dump(), **change})
    assert err.value.field == field


def test_shape_file_fields(tmp_path):
    path = tmp_path / "shape.json"
    path.write_text('{"family": "llama", "num_layers": 2}')
    with pytest.raises(ConfigError, match="hidden_size: is required"):
        ModelShape.from_file(path)
    path.write_text('{"family": "llama", "layers": 2}')
    with pytest.raises(ConfigError, match="layers: unknown field"):
        ModelShape.from_file(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="model: shape file .* must hold a mapping"):
        ModelShape.from_file(path)


def test_interleaved_local_layers():
    assert PRESETS["gemma3-interleaved"].local_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert all(PRESETS["mistral-44m"].local_layers)


def test_shared_types_import_neither_torch_nor_transformers():
    code = "import sys, chunkpilot.contract, engine.policy; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
