"""`chunkpilot prefill`: one prompt through the engine, its TTFT breakdown as a table or JSON.

Numbers arrive as strings and are checked here, so a bad value gets the field's name and range.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from chunkpilot.contract import ATTN_IMPLS, DTYPES, LAYOUTS, AttentionConfig, ConfigError, number

HELP = "run one prompt through the engine and print its TTFT breakdown"


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mistral-44m", help="preset, checkpoint folder or JSON/YAML shape file")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", help="torch threads (default: every core)")
    parser.add_argument("--attn-impl", "--attn", default="sdpa", choices=ATTN_IMPLS, help="attention implementation")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", default="0", help="seed of random weights (presets and shape files)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (the warm-up compiles)")


def add_attention_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", help="sliding window in tokens, or 'none' (default: the model's own)")
    parser.add_argument("--kv-layout", default="shift", choices=LAYOUTS)
    parser.add_argument("--sinks", default="0", help="first tokens every query sees besides the window")
    parser.add_argument("--global-tokens", action="append", help="tokens every later query sees besides the window "
                        "(selective SWA): positions 0,17,42, a token id id:5 or text:MARKER (its every occurrence); "
                        "repeatable")  # fmt: skip


def add_predictor_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--predictor-url", default="http://127.0.0.1:8000", help="the service `auto` asks")
    parser.add_argument("--predictor-timeout-ms", default="50", help="give up on the service after this long")
    parser.add_argument("--in-process", action="store_true", help="auto: load the champion here instead of HTTP")
    parser.add_argument("--no-telemetry", action="store_true", help="auto: do not report the prefills' outcomes")
    parser.add_argument("--schedule", action="store_true", help="auto: ask for a chunk schedule (sizes that change "
                        "along the prompt) chosen by the per-chunk cost model, when the champion has one")  # fmt: skip
    parser.add_argument("--telemetry-dir", type=Path, help="auto --in-process: the local partition of the outcomes "
                        "(default: $CHUNKPILOT_TELEMETRY_DIR, else data/ttft/telemetry, as the service)")  # fmt: skip


def auto_policy(args: argparse.Namespace, engine):
    """The `auto` policy for this engine: over HTTP, or in-process with --in-process."""
    from chunkpilot.tracking import tracking_uri
    from engine.hardware import local_hardware
    from engine.predictor_client import AutoPolicy, InProcessPolicy
    from engine.telemetry import Reporter, to_partition, to_service

    timeout_ms = number("predictor_timeout_ms", args.predictor_timeout_ms, int, ge=1, le=60_000)
    hardware = local_hardware(engine.config.dtype, engine.runtime.threads, engine.config.device)
    if args.in_process:
        from chunkpilot.dataset import TELEMETRY

        directory = args.telemetry_dir or Path(os.environ.get("CHUNKPILOT_TELEMETRY_DIR") or TELEMETRY)
        reporter = None if args.no_telemetry else Reporter(to_partition(directory))
        return InProcessPolicy(tracking_uri(), hardware, reporter=reporter, schedule=args.schedule)
    reporter = None if args.no_telemetry else Reporter(to_service(args.predictor_url))
    return AutoPolicy(args.predictor_url, timeout_ms / 1e3, hardware, reporter=reporter, schedule=args.schedule)


def add_args(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    prompt.add_argument("--prompts", type=Path, help="a stream: JSON lines of {\"text\": ...} or "
                        "{\"context_length\": N, \"seed\": S}, served one after another")  # fmt: skip
    parser.add_argument("--no-overlap", action="store_true", help="--prompts: prepare each request on its turn, "
                        "not during the previous prefill")  # fmt: skip
    parser.add_argument("--context-length", help="prompt length in tokens: synthetic text, or a cap on a given text")
    parser.add_argument(
        "--chunk-size",
        default="rule",
        help="a positive integer, 'full' (one shot), 'rule', 'auto' (ask the predictor) or a schedule "
        "'1024,512,256' (sizes in order, the last repeated until the prompt is covered)",
    )
    add_predictor_args(parser)
    add_attention_args(parser)
    parser.add_argument("--repeats", default="3", help="measured repeats after one warm-up")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def engine_config(args: argparse.Namespace):
    from engine.engine import EngineConfig

    return EngineConfig(args.model, args.dtype, args.threads, args.attn_impl, args.device, args.seed, args.compile)


def global_tokens(args: argparse.Namespace):
    """--global-tokens as the engine's GlobalTokens (None: not given)."""
    from engine.global_tokens import GlobalTokens

    return None if not args.global_tokens else GlobalTokens.parse(args.global_tokens)


def attention_config(args: argparse.Namespace, model_window: int | None) -> AttentionConfig:
    window = {None: model_window, "none": None}.get(args.window, args.window)
    return AttentionConfig(window=window, layout=args.kv_layout, sinks=args.sinks)


def run(args: argparse.Namespace) -> int:
    from engine.policy import parse_policy  # light: check what needs no model before loading torch

    policy = None if args.chunk_size == "auto" else parse_policy(args.chunk_size)
    globals_ = global_tokens(args)
    if args.prompts is not None:
        from .stream import run_stream

        return run_stream(args, policy)
    repeats = number("repeats", args.repeats, int, ge=1, le=1000)
    text = read_prompt(args)
    num_tokens = None if args.context_length is None else number("context_length", args.context_length, int, ge=1)

    from engine.engine import Engine, Prompt

    config = engine_config(args)
    engine = Engine(config)
    policy = policy or auto_policy(args, engine)
    attention = attention_config(args, engine.shape.window)
    try:
        measurement = engine.measure(Prompt(text, num_tokens), attention, policy, repeats, 1, globals_)
    finally:
        if hasattr(policy, "close"):  # `auto`: flushes its telemetry
            policy.close()
    report = {
        "config": {
            "model": args.model,
            "family": engine.shape.family,
            "parameters": engine.shape.parameters,
            "shape": engine.shape.model_dump(),
            "attention": {
                "window": attention.window,
                "layout": attention.layout,
                "sinks": attention.sinks,
                "global_tokens": measurement.runs[0].global_tokens,
            },  # fmt: skip
            "dtype": config.dtype,
            "attn_impl": config.attn_impl,
            "compile": config.compile,
            "policy": args.chunk_size,
        },
        "runtime": engine.runtime.to_dict(),
        **measurement.to_dict(),
    }
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def read_prompt(args: argparse.Namespace) -> str | None:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("prompt_file", f"cannot read {args.prompt_file}: {exc}") from None
    if args.prompt is None and args.context_length is None:
        raise ConfigError("context_length", "give --context-length N, --prompt TEXT or --prompt-file FILE")
    return args.prompt


def format_report(report: dict) -> str:
    cfg, rt, med = report["config"], report["runtime"], report["median"]
    att = cfg["attention"]
    window = (
        "none"
        if att["window"] is None
        else f"{att['window']} ({att['layout']}, sinks {att['sinks']}"
        + (f", {att['global_tokens']} global tokens)" if att["global_tokens"] else ")")
    )
    schedule = report["schedule"]
    chunks = f"schedule {','.join(map(str, schedule))}" if schedule else f"chunk {report['chunk_size']}"
    lines = [
        f"model     {cfg['model']} ({cfg['family']}, {cfg['parameters'] / 1e6:.1f}M params) {cfg['dtype']} "
        f"attn={cfg['attn_impl']} on {rt['device']}, {rt['threads']} threads",
        f"window    {window}",
        f"prompt    {report['context_length']} tokens, {chunks} ({report['decision_source']}) "
        f"-> {report['num_chunks']} chunks",
        *([f"fallback  {report['decision_reason']}"] if report["decision_reason"] else []),
        f"memory    KV cache {report['kv_cache_bytes'] / 2**20:.1f} MiB, "
        f"peak {report['peak_memory_bytes'] / 2**20:.0f} MiB",
        f"runtime   {rt['allocator']}; torch {rt['torch_version']}, transformers {rt['transformers_version']}",
        "",
        f"{'ms':<10}{'tokenize':>10}{'decide':>9}{'prefill':>11}{'decode':>9}{'TTFT':>11}",
    ]
    rows = [(f"repeat {i + 1}", r) for i, r in enumerate(report["repeats"])] + [("median", med)]
    for label, r in rows:
        lines.append(
            f"{label:<10}{r['tokenize_ms']:>10.1f}{r['decision_ms']:>9.2f}{r['prefill_ms']:>11.1f}"
            f"{r['first_decode_ms']:>9.1f}{r['ttft_ms']:>11.1f}"
        )
    chunk_ms = report["repeats"][-1]["chunk_ms"]
    shown = " ".join(f"{ms:.0f}" for ms in chunk_ms[:12]) + (" ..." if len(chunk_ms) > 12 else "")
    lines.append(f"chunks (last repeat, ms): {shown}")
    return "\n".join(lines)
