"""The policies side by side on prompts the model was never trained on: `auto` (the champion,
in-process), fixed 1024, the hand rule, the simple rule (one shot without a window, else the hand
rule) and one shot, measured by the one evaluator
(evaluation/comparison.py): every distinct chunk size per round for 3 rounds, interleaved, then only the
sizes still compared, rounds until the intervals of auto's savings over the rule and over 1024 are
narrower than 2% or --max-rounds pass. Prints per-prompt TTFT and regret against the measured
best, and each saving with its 95% interval. Needs a champion: run `make demo` or `chunkpilot
train` first.

The prompts use context lengths and windows that are not in data/specs/cpu-shipped.yaml (768 and
1536 are windows no shipped config has).

    .venv/bin/python bench/policies.py [--models llama-tiny,qwen2-gqa] [--max-rounds 20]
"""

from __future__ import annotations

import argparse
import time

from chunkpilot.chunks import simple_rule
from chunkpilot.contract import AttentionConfig
from chunkpilot.tracking import tracking_uri
from engine.config import EngineConfig
from engine.engine import Engine
from engine.policy import FixedPolicy, FullPolicy, RulePolicy
from engine.predictor_client import make_auto
from engine.workload import Workload
from evaluation.comparison import evaluate, format_evaluation

PROMPTS = {
    "llama-tiny": [
        Workload(700),
        Workload(2300, AttentionConfig(768, "shift")),
        Workload(4700, AttentionConfig(1536, "ring")),
        Workload(7100),
        Workload(10500, AttentionConfig(768, "ring", 4)),
        Workload(13000, AttentionConfig(1536, "shift", 4)),
    ],
    "qwen2-gqa": [
        Workload(900),
        Workload(1800, AttentionConfig(768, "ring")),
        Workload(3700, AttentionConfig(1536, "shift", 4)),
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PROMPTS))
    parser.add_argument("--max-rounds", type=int, default=20)
    args = parser.parse_args()
    start = time.monotonic()
    for model in args.models.split(","):
        engine = Engine(EngineConfig(model=model))
        auto = make_auto(engine.hardware(), tracking=tracking_uri())
        policies = {
            "auto": auto,
            "fixed 1024": FixedPolicy(1024, capped=True),
            "hand rule": RulePolicy(),
            "simple rule": RulePolicy("simple-rule", simple_rule),
            "one shot": FullPolicy(),
        }
        print(
            f"\n{model} ({engine.runtime.threads} threads), champion v{auto.predictor.version}, "
            f"at most {args.max_rounds} rounds:",
            flush=True,
        )
        tabled = auto.warm_up([engine.request(w.context_length, w.attention) for w in PROMPTS[model]])
        print(f"auto's decision table answers {tabled} of {len(PROMPTS[model])} prompts (built before any timing)")
        result = evaluate(
            engine,
            policies,
            PROMPTS[model],
            [("auto", "hand rule"), ("auto", "fixed 1024"), ("auto", "simple rule")],
            max_rounds=args.max_rounds,
        )
        print(format_evaluation(result), flush=True)
    print(f"\nfinished in {(time.monotonic() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
