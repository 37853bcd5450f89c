"""How the model does on a machine it never saw, before and after a short profile of that machine.

The shipped data holds two machines. Every policy is trained without any row of the new machine
("before"), then with the configs a 5-minute profile of it measures added ("after": the first
configs of its space-filling sweep, in the order measured, whose measuring time adds up to at most
`--minutes`), and judged on the new machine's other configs, the same ones in both rows.

    .venv/bin/python bench/new_machine.py [--data data/ttft/cpu-shipped] [--machine ID] [--minutes 5]
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from chunkpilot.paths import SHIPPED_DIR
from estimator.recipe import RECIPES
from judge.metrics import records, summarize_regret
from training.baselines import RankLevel, lineup_baselines
from training.data import load_table
from training.served import served_fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SHIPPED_DIR)
    parser.add_argument("--machine", help="the machine held out (default: the one with the newest rows)")
    parser.add_argument("--minutes", type=float, default=5.0, help="the short profile's budget")
    args = parser.parse_args()
    table = load_table(args.data)
    configs = table.rows.drop_duplicates("group")
    machine = args.machine or configs.sort_values("started_at").hardware_id.iloc[-1]
    new = configs[configs.hardware_id == machine].sort_values("started_at")
    old = configs[configs.hardware_id != machine].group.to_numpy()
    spent = (new.finished_at - new.started_at).dt.total_seconds().cumsum()
    profiled = new.group[spent <= 60 * args.minutes].to_numpy()
    judged = new.group[spent > 60 * args.minutes].to_numpy()
    print(
        f"new machine {machine} ({new.device_name.iloc[0]}): {len(new)} configs; a {args.minutes:g}-minute profile "
        f"measures {len(profiled)}, the other {len(judged)} are judged; {len(old)} configs of other machines"
    )
    test = table.subset(judged)
    print(f"\n{'policy':<22}{'':>8}{'mean':>8}{'p95':>8}{'within5%':>10}{'MAPE':>8}")
    for label, train in (("before", old), ("after", [*old, *profiled])):
        fitted = served_fit(list(RECIPES), {})(table.subset(train))  # the recipes as they serve
        for policy in (*lineup_baselines(), RankLevel()):
            fitted[policy.name] = copy.copy(policy)
            fitted[policy.name].fit(table.subset(train))
        for name, policy in fitted.items():
            m = summarize_regret(records(test.rows, policy.choose(test)))
            mape = f"{m['mape']:>8.1%}" if m["mape"] == m["mape"] else f"{'':>8}"
            print(
                f"{name:<22}{label:>8}{m['mean_regret']:>8.1%}{m['p95_regret']:>8.1%}{m['within_5pct']:>10.0%}{mape}",
                flush=True,
            )


if __name__ == "__main__":
    main()
