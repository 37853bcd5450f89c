"""`chunkpilot demo`: the engine on two prompt lengths and two attention configs, one shot
against the hand rule, each with its TTFT breakdown."""

from __future__ import annotations

import argparse

from chunkpilot.config import AttentionConfig, check_int

from .cli import add_engine_args, engine_config

HELP = "the main job: a short engine demo over prompt lengths and attention configs"


def add_args(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.add_argument("--lengths", default="1024,4096", help="comma-separated prompt lengths in tokens")
    parser.add_argument("--window", default="1024", help="the window of the SWA config")
    parser.add_argument("--repeats", default="2", help="measured repeats after one warm-up")


def run(args: argparse.Namespace) -> int:
    from .engine import Engine, Prompt
    from .policy import FullPolicy, RulePolicy

    lengths = [check_int("lengths", n, 1) for n in args.lengths.split(",")]
    repeats = check_int("repeats", args.repeats, 1, 100)
    window = check_int("window", args.window, 1)
    engine = Engine(engine_config(args))
    print(f"{args.model}: {engine.loaded.parameters / 1e6:.1f}M params, {engine.config.dtype}, "
          f"{engine.runtime.threads} threads, {engine.runtime.allocator}")
    print(f"median of {repeats} repeats after a warm-up, in ms\n")
    header = f"{'tokens':>6} {'attention':<14}{'policy':<7}{'chunk':>6}{'chunks':>7}{'tokenize':>9}{'prefill':>9}{'decode':>8}{'TTFT':>9}"
    print(header)
    for n in lengths:
        for label, attention in (("full", AttentionConfig()), (f"SWA {window} shift", AttentionConfig(window=window))):
            for policy in (FullPolicy(), RulePolicy()):
                m = engine.measure(Prompt(num_tokens=n), attention, policy, repeats)
                med, first = m.median, m.runs[0]
                print(f"{n:>6} {label:<14}{policy.name:<7}{first.chunk_size:>6}{first.num_chunks:>7}"
                      f"{med['tokenize_ms']:>9.1f}{med['prefill_ms']:>9.1f}{med['first_decode_ms']:>8.1f}{med['ttft_ms']:>9.1f}",
                      flush=True)
    return 0
