"""The shapes of models people run (data/shapes/, from their published configs) are what their
model cards say, and the smallest runs in all three backends from the same seeded weights: the
bundled engine, stock generate and llama.cpp agree on its first token (Gemma 3's interleaved
sliding window too); llama.cpp's flash attention
gives the tokens of its default attention, and its rows say their quantisation and kernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chunkpilot.contract import AttentionConfig, ChunkRequest, ConfigError, Hardware, ModelShape
from chunkpilot.features import FEATURES, build
from engine.backends import open_engine
from engine.config import EngineConfig
from engine.policy import FixedPolicy
from engine.workload import Workload
from profiler.spec import Spec

MACHINE = Hardware(hardware_id="0123456789ab")  # a machine by its id, as the engine names its own
SHAPES = Path(__file__).parents[1] / "data" / "shapes"
# parameter counts on the models' cards (safetensors totals, tied embeddings counted once)
PUBLISHED = {
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "qwen2.5-0.5b": 494_032_768,
    "gemma-3-270m": 268_098_176,
    "llama-3.2-1b": 1_235_814_400,
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_each_real_shape_has_its_published_parameter_count(name):
    assert ModelShape.from_file(SHAPES / f"{name}.yaml").parameters == PUBLISHED[name]


def test_gemma_3_keeps_five_local_512_token_layers_to_one_global():
    shape = ModelShape.from_file(SHAPES / "gemma-3-270m.yaml")
    assert (shape.family, shape.window, shape.global_every, shape.num_layers) == ("gemma3", 512, 6, 18)


def test_quantisation_and_flash_attention_are_llama_cpp_s_and_the_model_sees_them():
    request = ChunkRequest(context_length=1000, model="llama-tiny", hardware=MACHINE, backend="llama.cpp")
    assert (request.quant, request.attn_impl) == ("f32", "masked")  # a client that says neither
    with pytest.raises(ConfigError, match="quant"):
        ChunkRequest(context_length=1000, model="llama-tiny", hardware=MACHINE, quant="q4_k_m")
    with pytest.raises(ConfigError, match="attn_impl"):
        ChunkRequest(
            context_length=1000, model="llama-tiny", hardware=MACHINE, backend="transformers", attn_impl="flash"
        )
    bits, machine = FEATURES.index("weight_bits"), {"matmul_gflops": 100.0}

    def weight_bits(**request) -> float:
        row = ChunkRequest(context_length=1000, model="llama-tiny", hardware=MACHINE, **request).row(machine)
        return float(build({**row, "chunk_size": 256})[0, bits])

    assert [weight_bits(backend="llama.cpp", quant=q) for q in ("f32", "q8_0", "q4_k_m")] == [32, 8.5, 4.89]
    assert weight_bits(dtype="bfloat16") == 16  # no quantisation: the dtype's bits


def test_a_spec_measures_quantisations_and_flash_only_on_llama_cpp():
    spec = Spec.from_dict(
        {
            "name": "mixed",
            "sweeps": [
                {
                    "models": ["llama-tiny"],
                    "contexts": [512],
                    "backends": ["chunkpilot", "llama.cpp"],
                    "attn_impls": ["split", "masked", "flash"],
                    "quants": ["q8_0", "q4_k_m"],
                }
            ],
        }
    )
    runs = sorted((c.backend, c.attn_impl, c.quant) for c in spec.configs)
    assert runs == [
        ("chunkpilot", "masked", None),
        ("chunkpilot", "split", None),
        *(("llama.cpp", kernel, q) for kernel in ("flash", "masked") for q in ("q4_k_m", "q8_0")),
    ]
    assert len({c.key for c in spec.configs}) == len(spec.configs)
    with pytest.raises(ConfigError, match="sweeps.0.attn_impls"):
        Spec.from_dict(
            {"name": "x", "sweeps": [{"models": ["llama-tiny"], "contexts": [512], "attn_impls": ["flash"]}]}
        )


@pytest.mark.native
def test_smollm2_135m_runs_in_the_three_backends_to_the_same_first_token():
    """The real shape from one seed in each backend; llama.cpp with flash attention and Q8_0 too."""
    model, workload = str(SHAPES / "smollm2-135m.yaml"), Workload(96)
    tokens = {
        backend: open_engine(EngineConfig(model=model, threads=2, backend=backend)).run(workload, FixedPolicy(32))
        for backend in ("chunkpilot", "transformers", "llama.cpp")
    }
    assert len({result.first_token for result in tokens.values()}) == 1
    flash = open_engine(EngineConfig(model=model, threads=2, backend="llama.cpp", attn_impl="flash", quant="q8_0"))
    assert flash.request(96, workload.attention).row({})["quant"] == "q8_0"
    assert flash.run(workload, FixedPolicy(32)).first_token == flash.run(workload, FixedPolicy(96)).first_token


@pytest.mark.native
def test_gemma_3_s_local_and_global_layers_run_in_llama_cpp_as_in_transformers():
    """Gemma 3 written to GGUF (its window, its pattern of five local layers to one global, the
    local layers' rotary base, its norms' 1 + w): on a prompt longer than the window the three
    backends agree on the first token (up to a near-tie of seeded weights' logits, within float
    rounding: on the AMD EPYC 99ce2872fe46 llama.cpp's top two were 4e-4 apart, the other way round),
    and llama.cpp's logits track the bundled engine's."""
    workload = Workload(700, AttentionConfig(512))  # past the window: the local layers slide
    results = {
        backend: open_engine(EngineConfig(model="gemma3-interleaved", threads=2, backend=backend)).run(
            workload, FixedPolicy(256)
        )
        for backend in ("chunkpilot", "transformers", "llama.cpp")
    }
    ours, theirs = (results[b].first_logits.float().numpy() for b in ("chunkpilot", "llama.cpp"))
    assert all(ours[result.first_token] >= ours.max() - 1e-3 for result in results.values())
    assert np.corrcoef(ours, theirs)[0, 1] > 0.999
