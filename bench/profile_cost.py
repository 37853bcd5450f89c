"""How long to profile a new machine: the chosen-chunk regret on a fixed evaluation set as the
profiling budget grows.

The shipped dataset records when each config was measured, so "B minutes of profiling" is the
prefix of configs the budget mode (space-filling order) would have measured in B minutes. A fixed
quarter of the spec's configs (by a hash of their key) is never trained on: it is the evaluation
set for every budget. For each budget the LightGBM regressor and the best single fixed size are
fitted on that prefix and choose for the evaluation configs; fixed 1024 and the hand rule need no
data and are the flat reference lines. Prints the table; writes the plot.

    .venv/bin/python bench/profile_cost.py [--budgets 5,15,30,60] [--plot docs/regret_vs_budget.png]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.paths import SHIPPED_DIR, SPECS_DIR
from estimator.recipe import DEFAULT
from judge.metrics import records, summarize_regret
from profiler.plan import space_filling_order
from profiler.spec import Spec
from training.baselines import BestSingleSize, FixedSpec
from training.data import Table, load_table
from training.served import served_fit


def held_out(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 4 == 0


def measured_minutes(table: Table) -> pd.Series:
    """config_key -> minutes the harness spent on it (first start to last finish, all candidates)."""
    spans = table.rows.groupby("config_key").agg(start=("started_at", "min"), end=("finished_at", "max"))
    return (spans.end - spans.start).dt.total_seconds() / 60


def evaluate(policy, train: Table | None, test: Table) -> dict[str, float]:
    if train is not None:
        policy.fit(train)
    return summarize_regret(records(test.rows, policy.choose(test)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=SPECS_DIR / "cpu-shipped.yaml")
    parser.add_argument(
        "--data",
        type=Path,
        default=SHIPPED_DIR / "664de6bcf2e9",
        help="one machine's files of the spec (default: the first shipped machine's)",
    )
    parser.add_argument("--budgets", default="5,15,30,60", help="minutes of profiling, comma-separated")
    parser.add_argument("--plot", type=Path, default=Path("docs/regret_vs_budget.png"))
    args = parser.parse_args()

    table = load_table(args.data)
    minutes = measured_minutes(table)
    measured = [c for c in Spec.from_file(args.spec).configs if c.key in minutes.index]
    pool = space_filling_order([c for c in measured if not held_out(c.key)])
    spent = np.cumsum([minutes[c.key] for c in pool])
    test = table.subset(table.rows.group[table.rows.config_key.map(held_out)].unique())
    budgets = [float(b) for b in args.budgets.split(",")] + [float(spent[-1])]
    print(
        f"{len(measured)} measured configs: {len(pool)} to train on ({spent[-1]:.0f} min of profiling), "
        f"{test.rows.group.nunique()} held out for evaluation\n"
    )

    flat = {p.name: evaluate(p, None, test) for p in (FixedSpec("fixed-1024", "1024"), FixedSpec("hand-rule", "rule"))}
    results = []
    for budget in budgets:
        keys = {c.key for c, t in zip(pool, spent, strict=True) if t <= budget}
        if len(keys) < 2:
            print(f"{budget:>6.0f} min: fewer than 2 configs fit, skipped")
            continue
        train = table.subset(table.rows.group[table.rows.config_key.isin(keys)].unique())
        served = served_fit([DEFAULT], {})(train)[DEFAULT]  # the served recipe, as it serves
        model, fixed = evaluate(served, None, test), evaluate(BestSingleSize(), train, test)
        results.append(
            {
                "minutes": budget,
                "configs": len(keys),
                "model": model["mean_regret"],
                "model_p95": model["p95_regret"],
                "model_within5": model["within_5pct"],
                "best_fixed": fixed["mean_regret"],
            }
        )

    frame = pd.DataFrame(results)
    print(
        f"{'budget':>9}{'configs':>9}{'model mean':>12}{'p95':>8}{'within 5%':>11}{'best fixed':>12}"
        f"{'fixed 1024':>12}{'hand rule':>11}"
    )
    for r in frame.itertuples():
        print(
            f"{r.minutes:>5.0f} min{r.configs:>9}{r.model:>12.1%}{r.model_p95:>8.1%}{r.model_within5:>11.0%}"
            f"{r.best_fixed:>12.1%}{flat['fixed-1024']['mean_regret']:>12.1%}{flat['hand-rule']['mean_regret']:>11.1%}"
        )
    plot(frame, flat, args.plot)
    print(f"\nplot: {args.plot}")


def plot(frame: pd.DataFrame, flat: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(frame.minutes, frame.model * 100, "o-", linewidth=2.5, label="LightGBM regressor (mean)")
    ax.plot(frame.minutes, frame.model_p95 * 100, "o:", label="LightGBM regressor (p95)")
    ax.plot(frame.minutes, frame.best_fixed * 100, "s--", label="best fixed size on the same data")
    for name, color in (("fixed-1024", "black"), ("hand-rule", "red")):
        ax.axhline(flat[name]["mean_regret"] * 100, color=color, linestyle="-.", linewidth=1, label=f"{name} (no data)")
    ax.set(
        xscale="log",
        xlabel="profiling budget (minutes of measurements)",
        ylabel="regret vs measured best (%)",
        title="Chosen-chunk regret on held-out configs vs profiling budget",
    )
    ax.set_xticks(frame.minutes, [f"{m:.0f}" for m in frame.minutes])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
