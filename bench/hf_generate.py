"""Stock transformers `generate` with ChunkPilot's decision: for a few prompt lengths, the time to the
first token of `model.generate(max_new_tokens=1)` with no chunking, `prefill_chunk_size=1024`, the
hand rule's size and `auto`'s (the champion in-process, engine/hf.py). Each distinct size is timed
once per round, interleaved and rotated after a warm-up, and every policy gets the time of the size
it chose; medians over rounds, the ratio to no chunking with a bootstrap 95% interval, and whether
every size gave the same first token. Needs a champion: run `chunkpilot train` first.

    .venv/bin/python bench/hf_generate.py [--model mistral-44m] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

from chunkpilot.tracking import tracking_uri
from engine.hf import auto_policy, prefill_chunk_size
from engine.measure import interleaved, median_ratio
from engine.models import load_model
from engine.policy import FixedPolicy, RulePolicy

LENGTHS = (2000, 4000, 8000)


@torch.inference_mode()
def first_token(model, ids: torch.Tensor, chunk: int | None) -> tuple[float, int]:
    """(ms, the first generated token) of generate with that prefill chunk size (None: one shot)."""
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, prefill_chunk_size=chunk
    )
    return (time.perf_counter() - t0) * 1e3, int(out[0, -1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mistral-44m")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = load_model(args.model).model
    model.set_attn_implementation("sdpa")  # as a stock user has it
    auto = auto_policy(model, tracking_uri())
    rng = np.random.default_rng(0)
    print(
        f"{args.model}: generate's time to the first token, ms (median over {args.rounds} rounds) and the ratio "
        "to no chunking [95% CI]"
    )
    print(
        f"{'tokens':>7}{'none':>8}" + "".join(f"{name:>30}" for name in ("fixed 1024", "rule", "auto")) + "  same token"
    )
    for n in LENGTHS:
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        chosen = {
            "none": None,
            "fixed 1024": prefill_chunk_size(model, n, FixedPolicy(1024, capped=True)).chunk_size,
            "rule": prefill_chunk_size(model, n, RulePolicy()).chunk_size,
            "auto": prefill_chunk_size(model, n, auto).chunk_size,
        }
        sizes = {
            c: functools.partial(first_token, model, ids, None if c is None or c >= n else c)
            for c in dict.fromkeys(chosen.values())
        }
        runs = interleaved(sizes, args.rounds)
        ms = {c: np.array([r[0] for r in rs]) for c, rs in runs.items()}
        tokens = {r[1] for rs in runs.values() for r in rs}
        base = ms[None]
        cells = []
        for name in ("fixed 1024", "rule", "auto"):
            mine = ms[chosen[name]]
            ratio, low, high = median_ratio(mine, base, rng)
            cells.append(f"{chosen[name]:>5} {np.median(mine):6.0f} {ratio:.3f} [{low:.3f}, {high:.3f}]")
        print(
            f"{n:>7}{np.median(base):>8.0f}" + "".join(f"{c:>30}" for c in cells) + f"  {len(tokens) == 1}", flush=True
        )
    print("(cells: chosen size, ms, ratio to no chunking [interval]; 'same token': every size gave one first token)")


if __name__ == "__main__":
    main()
