"""The memory side on held-out configs (training/memory.py): the memory model's error with each
config held out in turn (mean and p95, per backend and kernel), the share of budgeted decisions
whose measured peak stayed within the budget, and the TTFT given up against the unconstrained best
at budgets of 50% and 25% of one shot's measured peak; then TTFT against peak memory for every size
of every config, the Pareto front and the choices marked, written as a PNG. Appends its record to
results/runs.jsonl (evaluation.records), from which docs/memory.md's figures are rendered.

    .venv/bin/python bench/memory.py [--data data/ttft] [--plot docs/memory_pareto.png]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from chunkpilot.paths import DATA_ROOT
from evaluation.records import append_record, memory_record
from training.data import load_table
from training.memory import format_memory, judge_memory, pareto_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="the dataset root")
    parser.add_argument("--plot", type=Path, help="write TTFT against peak memory per config as a PNG")
    args = parser.parse_args()
    report = judge_memory(load_table(args.data), with_budgets=True)
    if report is None:
        parser.error(f"no row under {args.data} measured its peak by today's method (store.dataset.MEMORY_SINCE)")
    print(format_memory(report))
    command = shlex.join([".venv/bin/python", "bench/memory.py", *sys.argv[1:]])
    print(f"recorded in {append_record(memory_record(command, report))} (`chunkpilot results` renders docs/memory.md)")
    if args.plot:
        figure = pareto_figure(report.frame, report.choices)
        figure.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot} ({report.configs} configs)")


if __name__ == "__main__":
    main()
