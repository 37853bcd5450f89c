"""The policies side by side on prompts the model was never trained on: `auto` (the champion,
in-process), fixed 1024, the hand rule, one shot, and the measured best (a sweep of every feasible
chunk size), all measured in this one process, interleaved, after a warm-up. Prints per-prompt
TTFT and regret against the measured best, and the totals. Needs a champion: run `make demo` or
`chunkpilot train` first.

The prompts use context lengths and windows that are not in data/specs/cpu-shipped.yaml (768 and
1536 are windows no shipped config has).

    .venv/bin/python bench/policies.py [--models llama-tiny,qwen2-gqa] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chunkpilot.demo import compare  # noqa: E402
from chunkpilot.tracking import tracking_uri  # noqa: E402
from engine.engine import Engine, EngineConfig  # noqa: E402
from engine.policy import FixedPolicy, FullPolicy, RulePolicy  # noqa: E402
from engine.predictor_client import InProcessPolicy, local_hardware  # noqa: E402

# (tokens, window, layout, sinks)
PROMPTS = {
    "llama-tiny": [(700, None, "shift", 0), (2300, 768, "shift", 0), (4700, 1536, "ring", 0),
                   (7100, None, "shift", 0), (10500, 768, "ring", 4), (13000, 1536, "shift", 4)],
    "qwen2-gqa": [(900, None, "shift", 0), (1800, 768, "ring", 0), (3700, 1536, "shift", 4)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PROMPTS))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    start = time.monotonic()
    for model in args.models.split(","):
        engine = Engine(EngineConfig(model=model))
        auto = InProcessPolicy(tracking_uri(), local_hardware(dtype="float32", threads=engine.runtime.threads))
        policies = {"auto": auto, "fixed 1024": FixedPolicy(1024, capped=True), "hand rule": RulePolicy(),
                    "one shot": FullPolicy()}
        print(f"\n{model} ({engine.runtime.threads} threads), champion v{auto.predictor.version}, "
              f"{args.repeats} interleaved repeats:", flush=True)
        print(compare(engine, policies, args.repeats, PROMPTS[model]), flush=True)
    print(f"\nfinished in {(time.monotonic() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
