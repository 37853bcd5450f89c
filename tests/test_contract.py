"""The one request contract: a dataset row and the request that asks about the same config give
identical feature rows, so training and serving cannot disagree, for presets and for a checkpoint
whose LM head shares the embeddings (its parameter count differs from an untied model's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from auto.client import ask
from chunkpilot.contract import PRESETS, AttentionConfig, ChunkRequest, ConfigError, Hardware, ModelShape
from chunkpilot.features import INPUT_COLUMNS, build
from estimator.decide import resolve_hardware
from store.dataset import read_file

SHIPPED = Path(__file__).resolve().parents[1] / "data" / "ttft" / "cpu-shipped"


def served_features(request: ChunkRequest, chunk_sizes: list[int]) -> np.ndarray:
    """What the service builds for `request` (over HTTP: the JSON the engine's client sends)."""
    sent = ChunkRequest.model_validate_json(request.model_dump_json())
    hardware = resolve_hardware({}, sent.hardware, sent.dtype, sent.threads)
    return build({**sent.row(hardware), "chunk_size": chunk_sizes})


def trained_features(rows: pd.DataFrame) -> np.ndarray:
    """What training builds from dataset rows."""
    return build({c: rows[c].to_numpy() for c in INPUT_COLUMNS})


def test_every_shipped_config_gives_the_same_features_as_its_request():
    files = sorted(SHIPPED.rglob("*.parquet"))
    assert len(files) > 100
    for path in files[::7]:  # every machine, model, window and layout the data holds, a seventh of the files
        rows = read_file(path)  # as training reads it: an older file's missing columns at their defaults
        request = ChunkRequest.from_row(rows.iloc[0].to_dict())
        assert request.shape.parameters == rows.parameters.iloc[0]
        np.testing.assert_array_equal(served_features(request, rows.chunk_size.tolist()), trained_features(rows))


def test_a_tied_checkpoint_counts_its_parameters_once_in_training_and_serving(tmp_path):
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.models import build_model

    tied = PRESETS["llama-tiny"].model_copy(update={"tie_embeddings": True})
    build_model(tied).save_pretrained(tmp_path / "tied")
    engine = Engine(EngineConfig(model=str(tmp_path / "tied"), threads=1))
    real = sum(p.numel() for p in engine.model.parameters())  # the shared matrix counted once
    assert engine.shape.tie_embeddings and engine.shape.parameters == real < PRESETS["llama-tiny"].parameters

    hardware = {
        "hardware_id": "abc",
        "matmul_gflops": 100.0,
        "bandwidth_gbs": 10.0,
        "call_overhead_ms": 1.0,
        "cores": 2,
        "l2_cache_bytes": 2**20,
        "l3_cache_bytes": 2**25,
    }
    features = engine.request(3000, AttentionConfig(window=512, layout="ring"))
    row = {**features.row(hardware), "hardware_id": "abc", "family": "llama", "chunk_size": 256}  # as profiled
    request = ask(features, Hardware(**hardware))  # as the engine asks
    assert ChunkRequest.from_row(row) == request
    np.testing.assert_array_equal(served_features(request, [256]), trained_features(pd.DataFrame([row])))


def test_bounds_are_stated_once_and_named_in_errors():
    with pytest.raises(ConfigError, match="context_length: Input should be greater than or equal to 1"):
        ChunkRequest(context_length=0, model="llama-tiny", hardware={"hardware_id": "abc"})
    with pytest.raises(ConfigError, match=r"model\.num_kv_heads: must divide num_heads"):
        ChunkRequest(
            context_length=10,
            model={**PRESETS["llama-tiny"].model_dump(), "num_kv_heads": 3},
            hardware={"hardware_id": "abc"},
        )
    assert ModelShape(**{**PRESETS["llama-tiny"].model_dump(), "num_layers": "8"}).num_layers == 8  # shape files


def test_the_attention_kernel_defaults_to_what_runs_on_the_backend_and_split_runs_only_in_the_engine():
    """split (only the keys each query sees) is the bundled engine's kernel on a CPU; stock generate
    and llama.cpp run the dense mask (`masked`), and asking for split there is refused, named."""
    from engine.config import EngineConfig
    from profiler.spec import Spec

    hardware = {"hardware_id": "abc"}
    assert ChunkRequest(context_length=10, model="llama-tiny", hardware=hardware).attn_impl == "split"
    for backend in ("transformers", "llama.cpp"):
        assert ChunkRequest(context_length=10, model="llama-tiny", hardware=hardware, backend=backend).attn_impl == (
            "masked"
        )
        assert EngineConfig(backend=backend).attn_impl == "masked"
        with pytest.raises(ConfigError, match="attn_impl: split runs in the chunkpilot backend on cpu"):
            ChunkRequest(context_length=10, model="llama-tiny", hardware=hardware, backend=backend, attn_impl="split")
    assert EngineConfig().attn_impl == "split" and EngineConfig(attn_impl="masked").attn_impl == "masked"
    sweep = {"models": ["llama-tiny"], "contexts": [64], "backends": ["chunkpilot", "transformers"]}
    cpu = Spec.from_dict({"name": "s", "sweeps": [sweep]})
    assert {(c.backend, c.attn_impl) for c in cpu.configs} == {("chunkpilot", "split"), ("transformers", "masked")}
    gpu = Spec.from_dict({"name": "s", "device": "cuda", "sweeps": [sweep]})
    assert {c.attn_impl for c in gpu.configs} == {"masked"}  # torch's CPU flash kernel is CPU-only
    with pytest.raises(ConfigError, match="sweeps.0.attn_impls: split runs in the chunkpilot backend on cpu"):
        Spec.from_dict({"name": "s", "device": "cuda", "sweeps": [{**sweep, "attn_impls": ["split"]}]})


def test_every_field_of_the_answer_is_described_in_the_openapi_schema(tmp_path):
    """What /docs shows an engine's author: no field of the answer without its meaning."""
    from predictor.app import create_app
    from predictor.settings import Settings

    app = create_app(Settings(tracking_uri=f"sqlite:///{tmp_path / 'unused.db'}", poll_interval_s=0))
    schemas = app.openapi()["components"]["schemas"]
    for name in ("Decision", "Candidate"):
        undescribed = [field for field, spec in schemas[name]["properties"].items() if "description" not in spec]
        assert not undescribed, (name, undescribed)
