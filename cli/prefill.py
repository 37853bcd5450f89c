"""`chunkpilot prefill`: one prompt through the engine, its TTFT breakdown as a table or JSON.

Numbers arrive as strings and are checked here, so a bad value gets the field's name and range.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from chunkpilot.contract import ConfigError, number

from .options import (
    add_attention_args,
    add_engine_args,
    add_predictor_args,
    attention_config,
    auto_from_args,
    engine_config,
    global_tokens,
)
from .prefill_prompts import run_stream

HELP = "run one prompt through the engine and print its TTFT breakdown"


def add_args(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    prompt.add_argument(
        "--prompts",
        type=Path,
        help='a stream: JSON lines of {"text": ...} or {"context_length": N, "seed": S}, served one after another',
    )
    parser.add_argument(
        "--no-overlap",
        action="store_true",
        help="--prompts: prepare each request on its turn, not during the previous prefill",
    )
    parser.add_argument("--context-length", help="prompt length in tokens: synthetic text, or a cap on a given text")
    parser.add_argument(
        "--chunk-size",
        default="rule",
        help="a positive integer, 'full' (one shot), 'rule', 'simple-rule' (one shot without a window, else "
        "the rule), 'auto' (ask the predictor) or a schedule "
        "'1024,512,256' (sizes in order, the last repeated until the prompt is covered)",
    )
    add_predictor_args(parser)
    add_attention_args(parser)
    parser.add_argument("--repeats", default="3", help="measured repeats after one warm-up")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.policy import parse_policy  # light: check what needs no model before loading torch

    policy = None if args.chunk_size == "auto" else parse_policy(args.chunk_size)
    globals_ = global_tokens(args)
    if args.prompts is not None:
        return run_stream(args, policy)
    repeats = number("repeats", args.repeats, int, ge=1, le=1000)
    text = read_prompt(args)
    length = None if args.context_length is None else number("context_length", args.context_length, int, ge=1)

    from engine.backends import open_engine
    from engine.workload import Workload

    config = engine_config(args)
    engine = open_engine(config)
    policy = policy or auto_from_args(args, engine)
    workload = Workload(length, attention_config(args, engine.shape.window), globals_, text)
    try:
        measurement = engine.measure(workload, policy, repeats)
    finally:
        policy.close()  # `auto`: flushes its telemetry
    report = {
        "config": {
            "model": args.model,
            "family": engine.shape.family,
            "parameters": engine.shape.parameters,
            "shape": engine.shape.model_dump(),
            "attention": {
                "window": workload.attention.window,
                "layout": workload.attention.layout,
                "sinks": workload.attention.sinks,
                "global_tokens": measurement.runs[0].global_tokens,
            },
            "dtype": config.dtype,
            "attn_impl": config.attn_impl,
            "compile": config.compile,
            "backend": config.backend,
            "policy": args.chunk_size,
        },
        "runtime": engine.runtime.to_dict(),
        **measurement.to_dict(),
    }
    report["efficiency"] = efficiency(engine, workload.attention, report)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def efficiency(engine, attention, report: dict) -> dict:
    """The prefill's achieved GFLOP/s (the prompt's own FLOPs, chunkpilot.features.prefill_flops,
    over its median time) beside this machine's matmul peak at the engine's dtype and threads,
    measured in this process (engine.hardware.matmul_peak, as the profiler records it per row)."""
    from chunkpilot.contract import AttentionConfig
    from chunkpilot.features import prefill_flops
    from engine.hardware import matmul_peak

    att = AttentionConfig(attention.window, attention.layout, attention.sinks, report["global_tokens"])
    hardware = engine.hardware()
    row = engine.request(report["context_length"], att).row(hardware.model_dump())
    gflops = float(prefill_flops(row)[0]) / 1e9 / (report["median"]["prefill_ms"] / 1e3)
    peak = matmul_peak(engine.config.dtype, engine.runtime.threads, engine.config.device)
    return {"prefill_gflops": gflops, "matmul_peak_gflops": peak}


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
        f"attn={cfg['attn_impl']} on {rt['device']}, {rt['threads']} threads, backend {cfg['backend']}",
        f"window    {window}",
        f"prompt    {report['context_length']} tokens, {chunks} ({report['decision']['source']}) "
        f"-> {report['num_chunks']} chunks",
        *([f"why       {report['decision']['reason']}"] if report["decision"]["reason"] else []),
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
    achieved, peak = report["efficiency"]["prefill_gflops"], report["efficiency"]["matmul_peak_gflops"]
    lines.append(
        f"compute   {achieved:.1f} GFLOP/s in the prefill (median), {achieved / peak:.0%} of this machine's "
        f"matmul peak ({peak:.0f} GFLOP/s at {cfg['dtype']}, {rt['threads']} threads, measured now)"
    )
    chunk_ms = report["repeats"][-1]["chunk_ms"]
    shown = " ".join(f"{ms:.0f}" for ms in chunk_ms[:12]) + (" ..." if len(chunk_ms) > 12 else "")
    lines.append(f"chunks (last repeat, ms): {shown or 'not shown by this backend'}")
    return "\n".join(lines)
