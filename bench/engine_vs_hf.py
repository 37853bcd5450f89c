"""This engine's chunked prefill against transformers' own, side by side in one process.

Same weights, same prompt, same chunk size, interleaved repeats after a warm-up:
  engine    ChunkPilot's prefill (its prefill_ms: the prompt in chunks, logits of the last token)
  hf        model.generate(max_new_tokens=1, prefill_chunk_size=C): the same work in transformers
  forward   one plain forward of the whole prompt (logits_to_keep=1), for scale
Prints medians and the ratio engine / hf (target <= 1.00).

    .venv/bin/python bench/engine_vs_hf.py [--model mistral-44m] [--tokens 4096] [--chunks 512,1024] [--repeats 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from chunkpilot.contract import AttentionConfig
from engine.config import EngineConfig
from engine.engine import Engine
from engine.measure import interleaved
from engine.models import load_model
from engine.policy import FixedPolicy
from engine.workload import Workload


def engine_ms(engine: Engine, workload: Workload, chunk: int, tokens: dict) -> float:
    result = engine.run(workload, FixedPolicy(chunk))
    tokens["engine"] = result.first_token
    return result.prefill_ms


def hf_ms(hf, ids: torch.Tensor, chunk: int, tokens: dict) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        generated = hf.generate(ids, max_new_tokens=1, prefill_chunk_size=chunk, do_sample=False)
    tokens["hf"] = int(generated[0, -1])
    return (time.perf_counter() - t0) * 1e3


def forward_ms(hf, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        hf(input_ids=ids, logits_to_keep=1)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mistral-44m")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunks", default="512,1024")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    engine = Engine(EngineConfig(model=args.model, threads=args.threads))
    hf = load_model(args.model).model  # same seed, same weights; transformers' own sdpa path
    hf.set_attn_implementation("sdpa")
    hf.generation_config.pad_token_id = hf.generation_config.eos_token_id = None
    text = engine.text(Workload(args.tokens))
    ids = torch.tensor([engine.tokenizer.encode(text).ids[: args.tokens]])
    native_window = engine.shape.window

    print(f"{args.model}, {args.tokens} tokens, {engine.runtime.threads} threads, {engine.runtime.allocator}")
    print(f"median of {args.repeats} interleaved repeats after a warm-up, ms\n")
    print(f"{'window':<8}{'chunk':>6}{'engine':>10}{'hf':>10}{'forward':>10}{'engine/hf':>11}  same first token")
    for window in [native_window, None] if native_window else [None]:
        hf.config.sliding_window = window  # transformers builds its cache and mask from the config
        workload = Workload(args.tokens, AttentionConfig(window=window), text=text)
        for chunk in [int(c) for c in args.chunks.split(",")]:
            tokens: dict[str, int] = {}
            steps = {
                "engine": functools.partial(engine_ms, engine, workload, chunk, tokens),
                "hf": functools.partial(hf_ms, hf, ids, chunk, tokens),
                "forward": functools.partial(forward_ms, hf, ids),
            }
            times = interleaved(steps, args.repeats)
            med = {name: statistics.median(values) for name, values in times.items()}
            same = "yes" if tokens["engine"] == tokens["hf"] else f"NO ({tokens['engine']} vs {tokens['hf']})"
            print(
                f"{str(window):<8}{chunk:>6}{med['engine']:>10.0f}{med['hf']:>10.0f}{med['forward']:>10.0f}"
                f"{med['engine'] / med['hf']:>11.2f}  {same}",
                flush=True,
            )


if __name__ == "__main__":
    main()
