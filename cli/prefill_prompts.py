"""`chunkpilot prefill --prompts FILE.jsonl`: a stream of prompts through one engine, each
prepared (tokenized, its chunk decided) during the previous one's prefill unless --no-overlap."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from pydantic import Field, model_validator

from chunkpilot.contract import MAX_CONTEXT, ConfigError, Contract

from .options import attention_config, auto_from_args, engine_config, global_tokens


class StreamLine(Contract):
    """One line of the prompts file: a text (optionally capped), or synthetic text of a length."""

    text: str | None = None
    context_length: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_prompt(self) -> StreamLine:
        if self.text is None and self.context_length is None:
            raise ConfigError("text", "give a text or a context_length")
        return self


def read_lines(path: Path) -> list[StreamLine]:
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("prompts", f"cannot read {path}: {exc}") from None
    if not lines:
        raise ConfigError("prompts", f"{path} holds no prompt")
    out = []
    for i, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"prompts line {i}", f"not JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"prompts line {i}", "must be a JSON object")
        try:
            out.append(StreamLine(**data))
        except ConfigError as exc:
            raise ConfigError(f"prompts line {i}: {exc.field}", exc.message) from None
    return out


def run_stream(args: argparse.Namespace, policy) -> int:
    lines = read_lines(args.prompts)

    from engine.backends import open_engine
    from engine.stream import stream
    from engine.workload import Workload

    engine = open_engine(engine_config(args))
    policy = policy or auto_from_args(args, engine)
    attention = attention_config(args, engine.shape.window)
    globals_ = global_tokens(args)
    workloads = [Workload(line.context_length, attention, globals_, line.text, line.seed) for line in lines]
    workloads = [dataclasses.replace(w, text=engine.text(w)) for w in workloads]  # every text before the first
    overlap = not args.no_overlap
    try:
        engine.run(workloads[0], policy)  # warm-up, not reported
        if not args.json:
            print(
                f"{'#':>3}{'tokens':>8}{'chunk':>7}  {'source':<10}{'tokenize':>9}{'decide':>8}{'prefill':>10}"
                f"{'TTFT':>10}  (ms; overlap {'on' if overlap else 'off'})"
            )
        for i, result in enumerate(stream(engine, workloads, policy, overlap), 1):
            if args.json:
                print(json.dumps({"request": i, "overlap": overlap, **result.to_dict()}), flush=True)
            else:
                print(
                    f"{i:>3}{result.context_length:>8}{result.chunk_size:>7}  {result.decision.source:<10}"
                    f"{result.tokenize_ms:>9.1f}{result.decision_ms:>8.2f}{result.prefill_ms:>10.1f}"
                    f"{result.ttft_ms:>10.1f}",
                    flush=True,
                )
    finally:
        policy.close()
    return 0
