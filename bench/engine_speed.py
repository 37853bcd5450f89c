"""The bundled engine against itself before its attention and cache were rewritten, and against
stock `generate`, side by side in one process on the same weights and prompts:

  split     the default: only the keys each query sees, KV buffers written in place
  masked    the dense mask through PyTorch's SDPA over the same cache (`--attn-impl masked`)
  before    the engine at bdd8756: the dense mask over transformers' concatenating cache layers
  generate  stock `model.generate(prefill_chunk_size=c, max_new_tokens=1)`, where the config is the
            model's own attention (transformers runs no other)

Every (engine, size) is timed once per round (TTFT), the rounds interleaved and rotated after a
warm-up round. Per config it prints each engine's best size and one shot over it (under a window:
whether the window's saving is real), then for each policy (each engine's own measured best, the
hand rule, fixed 1024) the TTFT ratio of `before` and `masked` over `split` at the sizes they
choose, with paired 95% intervals; `generate` over `split` at the same sizes; the prefill's share
of the fp32 matmul peak measured in this process at split's best size; and what choosing the
measured best saves on split over fixed 1024 and over the hand rule.

    .venv/bin/python bench/engine_speed.py [--configs mistral-44m:4096:1024:shift,...] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from chunkpilot.chunks import clamp_chunk, landed, rule_size
from chunkpilot.contract import MAX_CONTEXT, NO_WINDOW, AttentionConfig, ConfigError, number
from chunkpilot.features import prefill_flops
from engine.backends import open_engine, own_attention
from engine.config import EngineConfig
from engine.engine import Engine, Prepared
from engine.hardware import matmul_peak
from engine.kv_cache import NO_GLOBALS, ChunkCache, FullLayer, Globals, ShiftLayer, Sinks
from engine.measure import interleaved
from engine.policy import FixedPolicy
from engine.workload import Workload
from judge.intervals import median_ratio

DEFAULT_CONFIGS = (
    "mistral-44m:4096:none,mistral-44m:4096:1024:shift,mistral-44m:4096:1024:ring,"
    "llama-tiny:8192:none,llama-tiny:8192:512:shift:4"
)
ENGINES = ("split", "masked", "before", "generate")


class ConcatFull(DynamicLayer):
    """bdd8756's full layer: transformers' dynamic layer, which concatenates the history at every chunk."""

    window = None

    def __init__(self) -> None:
        super().__init__()
        self.sinks, self.globals = Sinks(0), Globals(NO_GLOBALS)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states)
        self.key_positions = torch.arange(keys.shape[-2])
        self.key_global = torch.zeros_like(self.key_positions, dtype=torch.bool)
        return keys, values

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class ConcatShift(DynamicSlidingWindowLayer):
    """bdd8756's shift layer: transformers' sliding layer, which concatenates the window's keys and
    the chunk afresh at every step, with sinks and global tokens as the in-place layer has them."""

    def __init__(self, window: int, sinks: int, globals_: torch.Tensor) -> None:
        super().__init__(sliding_window=window)
        self.window = window
        self.sinks, self.globals = Sinks(sinks), Globals(globals_)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.globals.copy(key_states, value_states, self.get_seq_length())
        key_states, value_states = self.sinks.take(key_states, value_states)
        keys, values = super().update(key_states, value_states)
        end = self.sinks.size + self.cumulative_length
        positions = torch.arange(end - keys.shape[-2], end)
        keys, values, positions = self.sinks.prepend(keys, values, positions)
        keys, values, self.key_positions, self.key_global = self.globals.prepend(keys, values, positions)
        return keys, values

    def get_seq_length(self) -> int:
        return self.sinks.count + self.cumulative_length

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class Before(Engine):
    """The engine as it was at bdd8756: the dense mask over concatenating full and shift layers."""

    def new_cache(self, prepared: Prepared) -> ChunkCache:
        cache = super().new_cache(prepared)
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, ShiftLayer):
                cache.layers[i] = ConcatShift(layer.window, layer.sinks.size, layer.globals.positions)
            elif isinstance(layer, FullLayer):
                cache.layers[i] = ConcatFull()
        return cache


def parse_config(text: str) -> tuple[str, int, AttentionConfig]:
    """model:tokens:none, or model:tokens:window:layout[:sinks]."""
    model, tokens, *rest = text.split(":") + [""]
    try:
        n = number("configs", tokens, int, ge=1, le=MAX_CONTEXT)
        if rest[:2] == [NO_WINDOW, ""]:
            return model, n, AttentionConfig()
        window, layout, sinks = (rest + ["0"])[:3]
        return model, n, AttentionConfig(window=int(window), layout=layout, sinks=int(sinks or 0))
    except ValueError as exc:  # ConfigError names its field
        raise ConfigError(
            "configs", f"{text!r}: model:tokens:none or model:tokens:window:layout[:sinks] ({exc})"
        ) from None


def open_engines(model: str, attention: AttentionConfig, threads: int | None) -> dict[str, Engine]:
    engines = {
        "split": Engine(EngineConfig(model=model, threads=threads)),
        "masked": Engine(EngineConfig(model=model, threads=threads, attn_impl="masked")),
        "before": Before(EngineConfig(model=model, threads=threads, attn_impl="masked")),
    }
    if attention == own_attention(engines["split"].model.config):
        engines["generate"] = open_engine(EngineConfig(model=model, threads=threads, backend="transformers"))
    return engines


def compare(engines: dict[str, Engine], workload: Workload, sizes: list[int], rounds: int, peak: float) -> None:
    """Time every (engine, size) once per round and print the config's figures (module docstring)."""
    n, attention, split = workload.context_length, workload.attention, engines["split"]
    rng = np.random.default_rng(0)
    tokens: dict[tuple[str, int], int] = {}

    def step(name: str, size: int) -> float:
        result = engines[name].run(workload, FixedPolicy(size))
        tokens[name, size] = result.first_token
        return result.ttft_ms

    ms = interleaved({(e, c): (lambda e=e, c=c: step(e, c)) for e in engines for c in sizes}, rounds)
    med = {key: statistics.median(times) for key, times in ms.items()}
    best = {e: min(sizes, key=lambda c, e=e: med[e, c]) for e in engines}
    print(f"\n{split.config.model}, {n} tokens, {attention.label}; {split.runtime.threads} threads, {rounds} rounds")
    print(f"{'size':>8}" + "".join(f"{e + ' ms':>14}" for e in engines))
    for c in sizes:
        print(f"{'one shot' if c == n else c:>8}" + "".join(f"{med[e, c]:>14.0f}" for e in engines))
    for e in engines:
        chunked = min((c for c in sizes if c != n), key=lambda c, e=e: med[e, c])
        line = f"  {e}: best {best[e]} ({med[e, best[e]]:.0f} ms)"
        if n in sizes:
            r, lo, hi = median_ratio(ms[e, n], ms[e, chunked], rng)
            line += f"; one shot / best chunked ({chunked}) {r:.2f} [{lo:.2f}, {hi:.2f}]"
        print(line)
    allowed = attention.window, attention.layout
    policies = {
        "best": best,
        "hand rule": dict.fromkeys(engines, landed(sizes, rule_size(n, *allowed))),
        "fixed 1024": dict.fromkeys(engines, landed(sizes, clamp_chunk(1024, n, *allowed))),
    }
    for policy, chosen in policies.items():
        cells = []
        for other in [e for e in engines if e != "split"]:
            r, lo, hi = median_ratio(ms[other, chosen[other]], ms["split", chosen["split"]], rng)
            cells.append(f"{other}/split {r:.2f} [{lo:.2f}, {hi:.2f}]")
        print(f"  at {policy} ({', '.join(f'{e} {c}' for e, c in chosen.items())}): " + "; ".join(cells))
    row = split.request(n, attention).row(split.hardware().model_dump())
    gflops = float(prefill_flops(row)[0]) / 1e9 / (med["split", best["split"]] / 1e3)
    print(f"  split at its best: {gflops:.0f} GFLOP/s over its TTFT, {gflops / peak:.0%} of the matmul peak")
    for policy in ("fixed 1024", "hand rule"):
        r, lo, hi = median_ratio(ms["split", best["split"]], ms["split", policies[policy]["split"]], rng)
        print(f"  split: the measured best saves {1 - r:+.1%} [{1 - hi:+.1%}, {1 - lo:+.1%}] over {policy}")
    agree = len({tokens[e, c] for e in engines for c in sizes}) == 1
    print(f"  first tokens {'agree' if agree else 'DIFFER'} across engines and sizes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help="model:tokens:none or model:tokens:window:layout[:sinks],..."
    )
    parser.add_argument("--sizes", default="128,256,512,768,1024,2048", help="chunk sizes besides one shot")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    try:
        configs = [parse_config(text) for text in args.configs.split(",")]
        number("rounds", args.rounds, int, ge=1, le=1000)
    except ConfigError as exc:
        parser.error(str(exc))
    peak: float | None = None
    for model, n, attention in configs:
        engines = open_engines(model, attention, args.threads)
        if peak is None:
            peak = matmul_peak("float32", engines["split"].runtime.threads)
            print(f"fp32 matmul peak measured in this process: {peak:.0f} GFLOP/s")
        sizes = sorted({clamp_chunk(int(c), n, attention.window, attention.layout) for c in args.sizes.split(",")})
        if attention.layout != "ring" or attention.window is None:
            sizes.append(n)  # one shot (a ring takes at most a window per step)
        compare(engines, Workload(n, attention), sorted(set(sizes)), args.rounds, peak)


if __name__ == "__main__":
    main()
