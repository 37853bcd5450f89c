"""The backends beside the bundled engine: stock transformers generate() and llama.cpp on GGUF files
the project writes itself. Each profiles a tiny config into rows that say their backend; llama.cpp
gives the transformers model's first token on the same weights, and nearly its logits in each
quantisation; the helpers fall back to the hand rule with a reason, as the engine does. The tests
that run llama.cpp here are `native`: each runs in a child process, so a crash fails it, named."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from auto.client import make_auto
from chunkpilot.contract import AttentionConfig, ConfigError
from cli import main
from engine.backends import open_engine
from engine.config import EngineConfig
from engine.gguf_export import FTYPES
from engine.llama_lib import llama_cpp  # the llama extra, which `make` installs: its absence fails, never skips
from engine.policy import FixedPolicy, RulePolicy
from engine.workload import Workload
from profiler.spec import ProfileConfig, Spec
from store.dataset import read_dataset


def tiny_spec(backend: str) -> dict:
    return {
        "name": f"tiny-{backend.replace('.', '')}",
        "repeats": 2,
        "chunk_sizes": [16, 64, "full"],
        "sweeps": [{"models": ["llama-tiny"], "contexts": [100], "threads": [1], "backends": [backend]}],
    }


def test_a_backend_is_part_of_a_config_and_the_bundled_engine_keeps_its_keys():
    bundled = ProfileConfig("llama-tiny", 100, None, "none", 0, "float32", 1, "masked")
    other = ProfileConfig("llama-tiny", 100, None, "none", 0, "float32", 1, "masked", backend="llama.cpp")
    # a bundled-engine key hashes no backend, as before backends existed: resuming finds it (the
    # shipped files were renamed once, when the dense-mask kernel's name became `masked`)
    assert bundled.key == "llama-tiny-n100-w0n0-7f6f4b8502"
    assert other.key.startswith("llamacpp-llama-tiny-n100") and other.key != bundled.key
    with pytest.raises(ConfigError, match="backends"):
        Spec.from_dict(
            {**tiny_spec("chunkpilot"), "sweeps": [{"models": ["llama-tiny"], "contexts": [9], "backends": ["vllm"]}]}
        )


@pytest.mark.slow  # real profiles on two backends
@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_each_backend_profiles_rows_that_name_it(tmp_path, backend):
    spec = tiny_spec(backend)
    path, out = tmp_path / "spec.yaml", tmp_path / "ttft"
    path.write_text(yaml.safe_dump(spec))
    assert main(["profile", "--spec", str(path), "--out", str(out), "--no-mlflow"]) == 0
    df = read_dataset(out / spec["name"])
    assert set(df.backend) == {backend} and sorted(df.chunk_size) == [16, 64, 100]
    assert (df.ttft_ms > 0).all() and df.backend_version.notna().all()
    if backend == "llama.cpp":  # one llama_decode a chunk, each timed
        assert (df.chunk_ms.map(len) == df.num_chunks).all()
    else:  # generate shows no chunk boundaries
        assert df.chunk_ms.isna().all()


@pytest.mark.native
@pytest.mark.parametrize("model", ["llama-tiny", "qwen2-gqa"])
def test_llama_cpp_gives_the_transformers_first_token_on_the_same_weights(model):
    """f32 GGUF of the same seeded weights: the same first token at every chunk size, and logits
    that agree to float32 rounding (llama.cpp's kernels sum in another order)."""
    workload = Workload(300)
    bundled = open_engine(EngineConfig(model=model, threads=1))
    llama = open_engine(EngineConfig(model=model, threads=1, backend="llama.cpp"))
    reference = bundled.run(workload, FixedPolicy(300))
    for chunk in (32, 128, 300):
        result = llama.run(workload, FixedPolicy(chunk))
        assert result.first_token == reference.first_token and len(result.chunk_ms) == -(-300 // chunk)
        gap = (result.first_logits - reference.first_logits).abs().max() / reference.first_logits.abs().max()
        assert gap < 1e-3


@pytest.mark.native
@pytest.mark.parametrize(("quant", "agreement"), [("f16", 0.9999), ("q8_0", 0.999), ("q4_k_m", 0.95)])
def test_each_quantisation_runs_and_nearly_gives_the_f32_logits(quant, agreement):
    """GGUF quantised by llama.cpp's own quantizer from the same seeded weights: the file says its
    quantisation, and the first token's logits correlate with the f32 model's (weights of fewer
    bits, so less closely the fewer bits)."""
    workload = Workload(200)
    reference = open_engine(EngineConfig(model="llama-tiny", threads=1, backend="llama.cpp")).run(
        workload, FixedPolicy(64)
    )
    engine = open_engine(EngineConfig(model="llama-tiny", threads=1, backend="llama.cpp", quant=quant))
    file_type = llama_cpp().Llama(str(engine.gguf), vocab_only=True, verbose=False).metadata["general.file_type"]
    assert int(file_type) == FTYPES[quant]
    result = engine.run(workload, FixedPolicy(64))
    assert np.corrcoef(result.first_logits.numpy(), reference.first_logits.numpy())[0, 1] > agreement


@pytest.mark.native
def test_backends_refuse_what_they_cannot_run_naming_the_field():
    with pytest.raises(ConfigError, match="model.*sliding window"):
        open_engine(EngineConfig(model="mistral-44m", backend="llama.cpp"))
    llama = open_engine(EngineConfig(model="llama-tiny", threads=1, backend="llama.cpp"))
    with pytest.raises(ConfigError, match="attention"):
        llama.run(Workload(300, AttentionConfig(64, "ring")), FixedPolicy(32))
    stock = open_engine(EngineConfig(model="mistral-44m", threads=1, backend="transformers"))
    with pytest.raises(ConfigError, match="attention.*own attention"):
        stock.run(Workload(300, AttentionConfig(256, "ring")), FixedPolicy(64))
    with pytest.raises(ConfigError, match="quant.*only the llama.cpp backend"):
        EngineConfig(model="llama-tiny", backend="transformers", quant="q8_0")


@pytest.mark.native
def test_the_llama_cpp_helper_evaluates_in_the_chosen_size_and_falls_back_with_a_reason(tmp_path):
    from auto.llama_helper import chunk_request, chunked_eval
    from cli.processes import free_port
    from engine.backends import weights_of
    from engine.gguf_export import write_gguf
    from engine.hardware import local_hardware

    engine = open_engine(EngineConfig(model="llama-tiny", threads=1))
    path = write_gguf(weights_of(engine.model), engine.shape, tmp_path / "tiny.gguf")
    llm = llama_cpp().Llama(str(path), n_ctx=2048, n_batch=512, n_ubatch=512, n_threads_batch=1, verbose=False)
    request = chunk_request(llm, 1200)
    exclude = {"tie_embeddings"}  # GGUF metadata does not say; the file's tensors do
    assert request.shape.model_dump(exclude=exclude) == engine.shape.model_dump(exclude=exclude)
    assert request.backend == "llama.cpp" and request.threads == 1
    tokens = list(range(5, 1205))
    decision = chunked_eval(llm, tokens, RulePolicy())
    assert decision.chunk_size == 512 and llm.n_tokens == 1200  # the rule's 1024, cut to one micro-batch
    nobody = make_auto(local_hardware("float32", 1), service=f"http://127.0.0.1:{free_port()}", timeout_s=0.2)
    decision = chunked_eval(llm, tokens, nobody)
    assert decision.source == "fallback" and decision.reason and llm.n_tokens == 1200
    nobody.close()


@pytest.mark.slow  # a real profile in its worker process
def test_a_config_the_backend_refuses_is_recorded_as_failed_and_the_profile_goes_on(tmp_path, capsys):
    """What llama.cpp cannot run here (a window; on a CPU whose build crashes, a quantisation its
    probe refused) is one failed config, named with the reason, not the end of the sweep."""
    from profiler.run import run_profile

    spec = tiny_spec("llama.cpp")
    spec["sweeps"][0]["attention"] = [{"window": 64, "layout": "shift"}, {"window": None}]
    report = run_profile(Spec.from_dict(spec), tmp_path / "ttft")
    assert len(report.failed) == 1 and len(report.measured) == 1
    said = capsys.readouterr().err
    assert "w=64s" in said and "FAILED" in said and "the model's own attention (no window)" in said
