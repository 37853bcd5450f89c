"""Stock transformers `generate` with ChunkPilot's decision: for a few prompt lengths, the time to the
first token of `model.generate(max_new_tokens=1)` with no chunking, `prefill_chunk_size=1024`, the
hand rule's size, the simple rule's (one shot without a window, else the hand rule) and `auto`'s
(the champion in-process, auto/hf.py). Each distinct size is timed once per round, interleaved and
rotated after a warm-up, and every policy gets the time of the size it chose; medians over rounds,
the ratio to no chunking with a bootstrap 95% interval, gross and net (each policy charged its own
first decision, timed here, on every round), and whether every size gave the same first token.
Needs a champion: run `chunkpilot train` first.

    .venv/bin/python bench/hf_generate.py [--model mistral-44m] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

from auto.hf import auto_policy, chunk_request, prefill_chunk_size
from chunkpilot.chunks import simple_rule
from engine.measure import interleaved
from engine.models import load_model
from engine.policy import ChunkPolicy, FixedPolicy, RulePolicy
from judge.intervals import median_ratio
from store.tracking import tracking_uri

LENGTHS = (2000, 4000, 8000)
NAMES = ("fixed 1024", "rule", "simple rule", "auto")


def decided(model, n: int, policy: ChunkPolicy) -> tuple[int, float]:
    """(the policy's size for n tokens, ms the decision took)."""
    t0 = time.perf_counter()
    size = prefill_chunk_size(model, n, policy).chunk_size
    return size, (time.perf_counter() - t0) * 1e3


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
    policies = {
        "fixed 1024": FixedPolicy(1024, capped=True),
        "rule": RulePolicy(),
        "simple rule": RulePolicy("simple-rule", simple_rule),
        "auto": auto_policy(model, tracking_uri()),
    }
    rng = np.random.default_rng(0)
    tabled = policies["auto"].warm_up([chunk_request(model, n) for n in LENGTHS])
    print(f"auto's decision table answers {tabled} of {len(LENGTHS)} lengths (built before any timing)")
    print(
        f"{args.model}: generate's time to the first token, ms (median over {args.rounds} rounds) and the ratio "
        "to no chunking [95% CI], gross and net of each policy's first decision"
    )
    print(f"{'tokens':>7}{'none':>8}" + "".join(f"{name:>44}" for name in NAMES) + "  same token")
    for n in LENGTHS:
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        decisions = {name: decided(model, n, policy) for name, policy in policies.items()}
        chosen = {"none": None} | {name: size for name, (size, _) in decisions.items()}
        sizes = {
            c: functools.partial(first_token, model, ids, None if c is None or c >= n else c)
            for c in dict.fromkeys(chosen.values())
        }
        runs = interleaved(sizes, args.rounds)
        ms = {c: np.array([r[0] for r in rs]) for c, rs in runs.items()}
        tokens = {r[1] for rs in runs.values() for r in rs}
        base = ms[None]
        cells = []
        for name in NAMES:
            mine, charge = ms[chosen[name]], decisions[name][1]
            ratio, low, high = median_ratio(mine, base, rng)
            net = median_ratio(mine + charge, base, rng)[0]
            cells.append(
                f"{chosen[name]:>5} {np.median(mine):6.0f} {ratio:.3f} [{low:.3f}, {high:.3f}] {net:.3f} {charge:5.2f}"
            )
        print(
            f"{n:>7}{np.median(base):>8.0f}" + "".join(f"{c:>44}" for c in cells) + f"  {len(tokens) == 1}", flush=True
        )
    print(
        "(cells: chosen size, ms, ratio to no chunking [interval], the ratio net of the decision, the decision's ms; "
        "'same token': every size gave one first token)"
    )


if __name__ == "__main__":
    main()
