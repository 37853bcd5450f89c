"""`chunkpilot prefill`: JSON for every kind of model source, and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys

import pytest

from chunkpilot.contract import PRESETS, ChunkRequest
from cli import main
from engine.models import load_model
from engine.tokenizer import trained_tokenizer

SMALL = ["--context-length", "64", "--chunk-size", "16", "--repeats", "1", "--threads", "2"]


def prefill_json(capsys, *args: str) -> dict:
    assert main(["prefill", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_json_for_every_preset(capsys, preset):
    report = prefill_json(capsys, "--model", preset, *SMALL)
    assert report["config"]["shape"] == PRESETS[preset].model_dump()
    assert report["config"]["parameters"] == PRESETS[preset].parameters  # the light count matches the real model
    assert (report["context_length"], report["chunk_size"], report["num_chunks"]) == (64, 16, 4)
    run = report["repeats"][0]
    assert len(run["chunk_ms"]) == 4  # the prefill is its chunks, less a scheduler's stall between them
    assert math.isclose(sum(run["chunk_ms"]), run["prefill_ms"], rel_tol=0.05, abs_tol=1.0)
    parts = run["tokenize_ms"] + run["decision_ms"] + run["prefill_ms"] + run["first_decode_ms"]
    assert parts <= run["ttft_ms"] and run["kv_cache_bytes"] > 0 and run["peak_memory_bytes"] > 0
    assert report["runtime"]["allocator"].startswith("glibc mallopt")
    efficiency = report["efficiency"]  # the prompt's own FLOPs over the median prefill, beside the matmul peak
    assert 0 < efficiency["prefill_gflops"] < math.inf and efficiency["matmul_peak_gflops"] > 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint folder as users bring one: save_pretrained + the tokenizer, then loaded back."""
    folder = tmp_path_factory.mktemp("ckpt")
    loaded = load_model("llama-tiny")
    loaded.model.save_pretrained(folder)
    trained_tokenizer(PRESETS["llama-tiny"].vocab_size).save(str(folder / "tokenizer.json"))
    return folder


def test_checkpoint_folder_gives_the_same_model(capsys, checkpoint):
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    from_ckpt = prefill_json(capsys, "--model", str(checkpoint), *SMALL)
    from_preset = prefill_json(capsys, "--model", "llama-tiny", *SMALL)
    assert from_ckpt["config"]["shape"] == from_preset["config"]["shape"]
    assert from_ckpt["first_token"] == from_preset["first_token"]


def test_shape_file_sets_family_and_shape(capsys, tmp_path):
    shape = tmp_path / "my-model.yaml"
    shape.write_text(
        "family: qwen2\nnum_layers: 3\nhidden_size: 192\nnum_heads: 6\nnum_kv_heads: 2\n"
        "intermediate_size: 512\nvocab_size: 2048\nwindow: 32\n"
    )
    report = prefill_json(capsys, "--model", str(shape), *SMALL)
    assert report["config"]["shape"]["num_kv_heads"] == 2 and report["config"]["attention"]["window"] == 32
    as_json = tmp_path / "my-model.json"
    as_json.write_text(json.dumps({**report["config"]["shape"], "window": None}))
    assert prefill_json(capsys, "--model", str(as_json), *SMALL)["config"]["attention"]["window"] is None


def test_prompt_text_and_file(capsys, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Chunked prefill splits a long prompt into pieces. " * 20)
    from_file = prefill_json(capsys, "--model", "llama-tiny", "--prompt-file", str(prompt), "--repeats", "1")
    from_text = prefill_json(capsys, "--model", "llama-tiny", "--prompt", prompt.read_text(), "--repeats", "1")
    assert from_file["context_length"] == from_text["context_length"] > 100
    assert from_file["first_token"] == from_text["first_token"]
    capped = prefill_json(
        capsys, "--model", "llama-tiny", "--prompt-file", str(prompt), "--context-length", "50", "--repeats", "1"
    )
    assert capped["context_length"] == 50


def broken_folder(tmp_path, config_text: str | None):
    folder = tmp_path / "broken"
    folder.mkdir()
    if config_text is not None:
        (folder / "config.json").write_text(config_text)
    return str(folder)


BAD = {
    "chunk 0": (["--chunk-size", "0"], "chunk_size"),
    "chunk text": (["--chunk-size", "lots"], "chunk_size"),
    "window 0": (["--window", "0"], "window"),
    "window text": (["--window", "wide"], "window"),
    "ring chunk > window": (["--window", "32", "--kv-layout", "ring", "--chunk-size", "64"], "chunk_size"),
    "ring full > window": (["--window", "32", "--kv-layout", "ring", "--chunk-size", "full"], "chunk_size"),
    "sinks without window": (["--sinks", "4"], "sinks"),
    "context too long": (["--context-length", "40000"], "context_length"),
    "context text": (["--context-length", "4k"], "context_length"),
    "threads text": (["--threads", "two"], "threads"),
    "repeats 0": (["--repeats", "0"], "repeats"),
    "unknown preset": (["--model", "llama-7b"], "model"),
    "missing folder": (["--model", "/no/such/checkpoint"], "model"),
    "bad dtype": (["--dtype", "float8"], "--dtype"),
}


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own checks (choices) exit directly
        return exc.code


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(capsys, case):
    args, field = BAD[case]
    argv = [
        "prefill",
        "--model",
        "llama-tiny",
        "--context-length",
        "100",
        "--chunk-size",
        "16",
        "--repeats",
        "1",
        *args,
    ]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and field in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "config_text", [None, "{not json", '{"model_type": "llama", "vocab_size": 64}', '{"model_type": "bert"}']
)
def test_broken_checkpoint_folder(capsys, tmp_path, config_text):
    assert exit_code(["prefill", "--model", broken_folder(tmp_path, config_text), "--context-length", "8"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "model:" in err, err


def test_console_script_in_a_fresh_process():
    """The installed entry point: one JSON line on stdout; a bad value is one line on stderr."""
    ok = subprocess.run(
        [sys.executable, "-m", "cli", "prefill", "--model", "llama-tiny", *SMALL, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(ok.stdout)["num_chunks"] == 4
    bad = subprocess.run(
        [sys.executable, "-m", "cli", "prefill", "--chunk-size", "-3", "--context-length", "10"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "chunk_size" in bad.stderr
    shown = subprocess.run([sys.executable, "-m", "cli", "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == f"chunkpilot {importlib.metadata.version('chunkpilot')}"


def test_hardware_prints_the_json_a_request_carries(capsys):
    assert main(["hardware", "--threads", "2"]) == 0
    hardware = json.loads(capsys.readouterr().out)
    request = ChunkRequest.model_validate({"context_length": 3000, "model": "llama-tiny", "hardware": hardware})
    assert request.hardware.cores >= 1 and request.hardware.matmul_gflops > 0 and request.hardware.hardware_id
    assert main(["hardware", "--threads", "0"]) == 2  # one line naming the field, as every command
    assert "threads" in capsys.readouterr().err


def test_the_engine_options_are_the_engine_config_s_fields(capsys):
    """Defaults, choices, bounds and help written once, on EngineConfig: the CLI builds the same config."""
    from cli import build_parser
    from cli.options import engine_config
    from engine.config import EngineConfig

    args = build_parser().parse_args(["prefill"])
    assert engine_config(args) == EngineConfig()
    assert engine_config(build_parser().parse_args(["prefill", "--attn", "eager", "--threads", "3"])) == EngineConfig(
        attn_impl="eager", threads=3
    )
    with pytest.raises(SystemExit):
        main(["prefill", "--help"])
    shown = capsys.readouterr().out
    assert "(>= 1, <= 1024)" in shown and "{split,masked,eager,flash}" in shown and "default mistral-44m" in shown


def test_the_serve_options_are_the_service_settings_and_given_ones_win_over_the_environment(monkeypatch, capsys):
    """Every setting but the secret and the list is a `serve` option; one not given is left to
    CHUNKPILOT_* and the default, and a bad one is refused naming the field before anything starts."""
    from cli import build_parser
    from cli.fields import build, values
    from cli.serve import ENV_ONLY, FLAGS
    from predictor.settings import Settings

    assert set(FLAGS) | set(ENV_ONLY) == set(Settings.model_fields)
    monkeypatch.setenv("CHUNKPILOT_POLL_INTERVAL_S", "7")
    monkeypatch.setenv("CHUNKPILOT_EXPLORE_BUDGET", "0.3")
    args = build_parser().parse_args(["serve", "--explore-budget", "0.2", "--publish-telemetry"])
    settings = build(Settings, **values(args, FLAGS))
    assert (settings.explore_budget, settings.poll_interval_s, settings.publish_telemetry) == (0.2, 7.0, True)
    assert settings.host == Settings.model_fields["host"].default
    assert main(["serve", "--decision-budget", "2"]) == 2
    assert "decision_budget" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    shown = capsys.readouterr().out
    assert "(>= 0, <= 0.5)" in shown and "$CHUNKPILOT_EXPLORE_BUDGET, else 0.01" in shown
