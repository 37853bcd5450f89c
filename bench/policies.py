"""The policies side by side on prompts the model was never trained on, on one backend: `auto`
(the champion, in-process), fixed 1024, the hand rule, the simple rule (one shot without a window,
else the hand rule) and the backend's own default (the bundled engine: one shot; transformers'
generate: no chunking, one shot too; llama.cpp: its default micro-batch, n_ubatch 512), measured by
the one evaluator (evaluation/comparison.py): every distinct chunk size per round for 3 rounds,
interleaved, then only the sizes still compared, rounds until the intervals of auto's savings are
narrower than 2% or --max-rounds pass. Prints per-prompt TTFT and regret against the measured
best, and each saving with its 95% interval, gross and net of each policy's decision. Needs a
champion trained on the backend's rows: run `chunkpilot train` after profiling it.

The prompts use context lengths and windows that no shipped spec has (data/specs/: 768 and 1536
are windows no config has; the backends' lengths fall between their specs' log-spaced ones).

    .venv/bin/python bench/policies.py [--backend chunkpilot|transformers|llama.cpp] [--max-rounds 20]
"""

from __future__ import annotations

import argparse
import time

from chunkpilot.chunks import simple_rule
from chunkpilot.contract import AttentionConfig
from chunkpilot.tracking import tracking_uri
from engine.backends import open_engine
from engine.config import EngineConfig
from engine.policy import FixedPolicy, FullPolicy, RulePolicy
from engine.predictor_client import make_auto
from engine.workload import Workload
from evaluation.comparison import evaluate, format_evaluation

PROMPTS: dict[str, dict[str, list[Workload]]] = {}
PROMPTS["chunkpilot"] = {
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
PROMPTS["transformers"] = {  # each model's own attention: mistral-44m's 1024-token window
    "llama-tiny": [Workload(700), Workload(3000), Workload(6000)],
    "mistral-44m": [Workload(n, AttentionConfig(1024, "shift")) for n in (1200, 2500, 5000)],
}
PROMPTS["llama.cpp"] = {  # full attention only
    "llama-tiny": [Workload(700), Workload(3000), Workload(6000)],
    "qwen2-gqa": [Workload(1200), Workload(2500), Workload(5000)],
}
DEFAULTS = {  # what the backend does when nobody picks a size
    "chunkpilot": ("one shot", FullPolicy()),
    "transformers": ("no chunking", FullPolicy()),
    "llama.cpp": ("n_ubatch 512", FixedPolicy(512, capped=True)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="chunkpilot", choices=list(PROMPTS))
    parser.add_argument(
        "--models", help=f"comma-separated (default: the backend's, e.g. {','.join(PROMPTS['chunkpilot'])})"
    )
    parser.add_argument("--max-rounds", type=int, default=20)
    args = parser.parse_args()
    prompts = PROMPTS[args.backend]
    default, default_policy = DEFAULTS[args.backend]
    start = time.monotonic()
    for model in args.models.split(",") if args.models else prompts:
        engine = open_engine(EngineConfig(model=model, backend=args.backend))
        auto = make_auto(engine.hardware(), tracking=tracking_uri())
        policies = {
            "auto": auto,
            "fixed 1024": FixedPolicy(1024, capped=True),
            "hand rule": RulePolicy(),
            "simple rule": RulePolicy("simple-rule", simple_rule),
            default: default_policy,
        }
        print(
            f"\n{model} on {args.backend} ({engine.runtime.threads} threads), champion v{auto.predictor.version}, "
            f"at most {args.max_rounds} rounds:",
            flush=True,
        )
        tabled = auto.warm_up([engine.request(w.context_length, w.attention) for w in prompts[model]])
        print(f"auto's decision table answers {tabled} of {len(prompts[model])} prompts (built before any timing)")
        result = evaluate(
            engine,
            policies,
            prompts[model],
            [("auto", "hand rule"), ("auto", "fixed 1024"), ("auto", "simple rule"), ("auto", default)],
            max_rounds=args.max_rounds,
        )
        print(format_evaluation(result), flush=True)
    print(f"\nfinished in {(time.monotonic() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
