"""`auto` raced against the lineup on one backend, on prompts drawn afresh: `auto` (the champion,
in-process) against one shot, the backend's own default (the bundled engine's hand rule,
generate without chunking, llama.cpp's n_ubatch 512), this machine's best single size (from its
own profile rows of the backend and kernel), the hand rule, the simple rule and fixed 1024
(judge.lineup), measured by the one evaluator (evaluation/comparison.py): every distinct
chunk size per round for 3 rounds, interleaved, then only the sizes still compared, rounds until
the intervals of auto's savings are narrower than 2% or --max-rounds pass. Prints per-prompt TTFT
and regret against the measured best, and auto's saving over each baseline, the strongest first,
gross, warm and cold (its first decisions of kinds never seen, and the decision tables they built
on these cores), with 95% intervals; appends the run's record to results/ (evaluation/records.py).
Needs a champion trained on the backend's rows: run `chunkpilot train` after profiling it.

The prompts are drawn from --seed (default: a new one, printed and recorded) so that their
lengths and windows are none of the model's rows under --data (evaluation/prompts.py); --prompts
gives lengths instead (comma-separated, the backend's own attention).

    .venv/bin/python bench/policies.py [--backend chunkpilot|transformers|llama.cpp] [--max-rounds 20]
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import sys
import time
from pathlib import Path

from auto.client import ask, make_auto
from chunkpilot.contract import BACKENDS, QUANTS, AttentionConfig, ConfigError, number
from chunkpilot.paths import DATA_ROOT
from engine.backends import open_engine, own_attention
from engine.config import EngineConfig
from engine.workload import Workload
from evaluation.comparison import evaluate, format_evaluation
from evaluation.lineup import baseline_policies, charge_table_builds, machine_best
from evaluation.prompts import Seen, draw_prompts, race_kinds
from evaluation.records import append_record, race_record
from store.dataset import read_dataset
from store.tracking import tracking_uri

MODELS = {
    "chunkpilot": "llama-tiny,qwen2-gqa",
    "transformers": "llama-tiny,mistral-44m",
    "llama.cpp": "llama-tiny,qwen2-gqa",
}


def prompts_for(args: argparse.Namespace, engine, seed: int) -> list[Workload]:
    own = AttentionConfig() if engine.backend == "chunkpilot" else own_attention(engine.model.config)
    if args.prompts:
        lengths = [number("prompts", n, int, ge=1) for n in args.prompts.split(",")]
        return [Workload(n, own) for n in lengths]
    rows = read_dataset(args.data)
    mine = rows[rows.model == engine.config.model]
    seen = Seen.of(zip(mine.context_length.tolist(), mine.window.tolist(), strict=True))
    drawn = draw_prompts(seed, seen, race_kinds(engine.backend))
    return drawn if engine.backend == "chunkpilot" else [Workload(w.context_length, own, seed=w.seed) for w in drawn]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="chunkpilot", choices=BACKENDS)
    parser.add_argument("--models", help="comma-separated (default: the backend's, e.g. llama-tiny,qwen2-gqa)")
    parser.add_argument("--quant", default="f32", choices=QUANTS, help="llama.cpp: the GGUF's weights")
    parser.add_argument("--max-rounds", default="20", help="most measuring rounds (1-200)")
    parser.add_argument("--seed", help="the prompts' seed (default: drawn now, printed and recorded)")
    parser.add_argument("--prompts", help="comma-separated lengths instead of drawn prompts")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="the rows whose lengths the prompts avoid")
    args = parser.parse_args()
    try:
        max_rounds = number("max_rounds", args.max_rounds, int, ge=1, le=200)
        seed = number("seed", args.seed, int, ge=0, le=2**31 - 1) if args.seed else secrets.randbelow(2**31)
    except ConfigError as exc:
        parser.error(str(exc))
    command = shlex.join([".venv/bin/python", "bench/policies.py", *sys.argv[1:]])
    start = time.monotonic()
    for model in (args.models or MODELS[args.backend]).split(","):
        engine = open_engine(EngineConfig(model=model, backend=args.backend, quant=args.quant))
        hardware = engine.hardware()
        auto = make_auto(hardware, tracking=tracking_uri())
        forests = auto.forests_ready()  # compiled once per machine and model: never beside a timed prefill
        workloads = prompts_for(args, engine, seed)
        baselines = baseline_policies(args.backend, machine_best(args.data, engine))
        print(
            f"\n{model} on {args.backend} ({engine.runtime.threads} threads), champion v{auto.predictor.version} "
            f"(forests {forests['forests']}, waited for before timing), at most {max_rounds} rounds; prompts of "
            f"seed {seed}: {'; '.join(w.label for w in workloads)}",
            flush=True,
        )
        table = auto.predictor.recipe.table

        def kind_of(p, engine=engine, hardware=hardware) -> str:
            return ask(engine.request(p.case.context_length, p.case.attention), hardware).kind()

        def tables(table=table) -> tuple[int, int, float]:
            summary = table.summary()
            return summary["kinds"], summary["kinds_built"], summary["build_s_total"]

        try:
            result = evaluate(
                engine,
                {"auto": auto, **baselines},
                workloads,
                [("auto", name) for name in baselines],
                max_rounds=max_rounds,
                after_first=charge_table_builds(kind_of, tables),
            )
        finally:
            auto.close()
        print(format_evaluation(result), flush=True)
        append_record(race_record(result, command, None if args.prompts else seed, args.backend, model))
    print(f"\nfinished in {(time.monotonic() - start) / 60:.1f} min; recorded in results/runs.jsonl")


if __name__ == "__main__":
    main()
