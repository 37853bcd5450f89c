"""The memory side judged on held-out configs: how far the memory model (estimator.memory) is off,
whether budgeted choices kept their budgets, and what a budget costs in TTFT.

The memory model's error: each config predicted by a memory model fitted without it (leave one
config out). The budgets: the recipe fitted on the other folds' configs (its cost model and its
memory model both held out) asked about each config as the service asks (`Recipe.decide`, the
request carrying `memory_budget_mb`, the candidates its measured sizes), so what is judged is
what is served. A budget is a share of the config's measured one-shot peak; the budgeted choice
kept it when its measured peak stayed within it, and gave up its measured TTFT over the recipe's
unconstrained choice's.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.chunks import rule_candidate
from chunkpilot.contract import window_column
from estimator.decide import Infeasible
from estimator.memory import MIB, MemoryModel, held_out
from estimator.recipe import DEFAULT, Recipe
from store.dataset import memory_measured

from .data import Table, hardware_table
from .served import fit_recipes, request_of

SHARES = (0.5, 0.25)  # budgets as shares of one shot's measured peak


@dataclass(frozen=True)
class Budgeted:
    share: float
    decisions: int  # configs where some size was predicted to fit
    refused: int  # configs where none was (a clear refusal, not a decision)
    kept: float  # share of the decisions whose measured peak stayed within the budget
    given_up: float  # mean TTFT of the budgeted choice over the unconstrained best, - 1
    given_up_p95: float


@dataclass(frozen=True)
class MemoryReport:
    rows: int
    configs: int
    mean_error: float  # |measured / predicted - 1|, held out
    p95_error: float
    margin: float  # for a backend and kernel without rows (each kind's own: per_backend)
    per_backend: dict[str, tuple[float, float, int, float]]  # backend/kernel -> (mean, p95 error, configs, margin)
    budgets: list[Budgeted]  # empty unless asked for (judge_memory's with_budgets)
    frame: pd.DataFrame  # the measured rows with `predicted_mb` (held out)
    choices: dict[str, Choices]  # group -> auto's choices, held out (empty unless the budgets were asked for)


def measured_memory(table: Table) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows that measured their peak by today's method (store.dataset.memory_measured) and their
    feature rows."""
    keep = memory_measured(table.rows).to_numpy()
    return table.rows[keep].reset_index(drop=True), table.x[keep]


def judge_memory(table: Table, with_budgets: bool = False) -> MemoryReport | None:
    """The held-out report (the budgets too, if asked: a recipe fit per fold), or None where fewer
    than two configs measured their peak."""
    rows, x = measured_memory(table)
    if rows.config_key.nunique() < 2:  # nothing to hold out
        return None
    peak = rows.prefill_memory_bytes.to_numpy(dtype=float)
    configs = rows.config_key.to_numpy()  # a config measured on two machines is held out from both
    rise = held_out(x, peak, configs)  # measured / predicted - 1
    model = MemoryModel().fit(x, peak, configs, rise)
    frame = rows.assign(measured_mb=peak / MIB, predicted_mb=peak / MIB / (1 + rise), rise=rise)
    error = np.abs(rise)
    kinds = frame.backend + "/" + frame.attn_impl
    margins = model.margin_of(x)
    per_backend = {
        kind: (
            float(np.mean(error[m])),
            float(np.quantile(error[m], 0.95)),
            int(frame.config_key[m].nunique()),
            margins[m][0],
        )
        for kind in sorted(kinds.unique())
        if (m := (kinds == kind).to_numpy()).any()
    }
    choices = held_out_choices(table) if with_budgets else {}
    return MemoryReport(
        len(frame),
        int(frame.config_key.nunique()),
        float(error.mean()),
        float(np.quantile(error, 0.95)),
        model.margin,
        per_backend,
        budgeted(frame, choices) if choices else [],
        frame,
        choices,
    )


Choices = dict[str, int | None]  # "auto" and "auto, budget 50%"... -> its size (None: refused)


def auto_choices(recipe: Recipe, config: pd.DataFrame, shares: tuple[float, ...] = SHARES) -> Choices:
    """The recipe's choice for one config (its measured rows), asked as the service is asked
    (`Recipe.decide`, the measured sizes as candidates): unconstrained, and under a budget of
    each share of its measured one-shot peak (none on a ring: it has no one shot)."""
    request = request_of(config)
    out: Choices = {"auto": recipe.decide(request).chunk_size}
    one_shot = config[config.is_full]
    for share in shares if not one_shot.empty else ():
        budget = share * float(one_shot.prefill_memory_bytes.iloc[0]) / MIB
        try:
            out[label(share)] = recipe.decide(request.model_copy(update={"memory_budget_mb": budget})).chunk_size
        except Infeasible as exc:
            if exc.reason != "over_memory_budget":
                raise
            out[label(share)] = None  # refused: no size predicted to fit
    return out


def label(share: float) -> str:
    return f"auto, budget {share:.0%}"


def held_out_choices(table: Table, folds: int = 4) -> dict[str, Choices]:
    """group -> auto's choices, each config asked of the recipe fitted on the other folds' configs
    (a config held out on every machine that measured it)."""
    rows, _ = measured_memory(table)
    configs = rows.config_key.unique()
    hardware = hardware_table(table.rows)
    out = {}
    for k in range(min(folds, len(configs))):
        held = table.rows.group[table.rows.config_key.isin(configs[k::folds])].unique()
        with tempfile.TemporaryDirectory(prefix="chunkpilot-memory-") as tmp:
            train = table.subset(np.setdiff1d(table.rows.group.unique(), held))
            recipe = fit_recipes([DEFAULT], {}, train, Path(tmp), hardware)[DEFAULT]
        out |= {g: auto_choices(recipe, rows[rows.group == g]) for g in held if (rows.group == g).any()}
    return out


def budgeted(frame: pd.DataFrame, choices: dict[str, Choices], shares: tuple[float, ...] = SHARES) -> list[Budgeted]:
    """Each share's outcome: whether the budgeted choice's measured peak stayed within the budget,
    and its measured TTFT over the unconstrained choice's."""
    outcomes: dict[float, list[tuple[bool, float] | None]] = {share: [] for share in shares}
    for g, config in frame.groupby("group", sort=False):
        found = choices[g]
        at = config.set_index("chunk_size")
        for share in shares:
            if label(share) not in found:
                continue
            size = found[label(share)]
            if size is None:
                outcomes[share].append(None)
                continue
            budget = share * float(at.measured_mb[config.context_length.iloc[0]])
            outcomes[share].append((at.measured_mb[size] <= budget, at.ttft_ms[size] / at.ttft_ms[found["auto"]] - 1))
    return [_summary(share, found) for share, found in outcomes.items()]


def _summary(share: float, found: list[tuple[bool, float] | None]) -> Budgeted:
    decided = [f for f in found if f is not None]
    kept, given_up = [k for k, _ in decided], [g for _, g in decided]
    nan = float("nan")
    return Budgeted(
        share,
        len(decided),
        len(found) - len(decided),
        float(np.mean(kept)) if kept else nan,
        float(np.mean(given_up)) if given_up else nan,
        float(np.quantile(given_up, 0.95)) if given_up else nan,
    )


def format_memory(report: MemoryReport) -> str:
    lines = [
        f"memory model, each config held out in turn: {report.rows} rows of {report.configs} configs; "
        f"|measured / predicted - 1| mean {report.mean_error:.1%}, p95 {report.p95_error:.1%} "
        "(target p95 <= 10%)"
    ]
    lines += [
        f"  {kind:<24} mean {mean:6.1%}  p95 {p95:6.1%}  safety margin {margin:6.1%}  ({n} configs)"
        for kind, (mean, p95, n, margin) in report.per_backend.items()
    ]
    for b in report.budgets:
        lines.append(
            f"budget {b.share:.0%} of one shot's measured peak: {b.decisions} decisions, {b.refused} refused "
            f"(no size predicted to fit); measured peak within the budget in {b.kept:.1%} (target >= 99%); "
            f"TTFT given up against auto's unconstrained choice: mean {b.given_up:+.1%}, p95 {b.given_up_p95:+.1%}"
        )
    return "\n".join(lines)


def pareto_figure(frame: pd.DataFrame, choices: dict[str, Choices], columns: int = 4):
    """One panel per config: TTFT against measured peak memory for every size, the Pareto front (no
    size both faster and smaller) drawn; one shot, the hand rule and `auto`'s choices (free and under
    each budget, the budgets drawn) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(frame.groupby("group", sort=False))
    rows = -(-len(configs) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.0 * rows), squeeze=False)
    for ax, (g, config) in zip(axes.flat, configs, strict=False):
        config = config.sort_values("measured_mb")
        first = config.iloc[0]
        ax.scatter(config.measured_mb, config.ttft_ms, s=14, color="0.5", zorder=2)
        for _, r in config.iterrows():
            ax.annotate(str(int(r.chunk_size)), (r.measured_mb, r.ttft_ms), fontsize=6, alpha=0.7)
        front = config[config.ttft_ms <= config.ttft_ms.cummin()]  # sorted by memory: faster than all smaller
        ax.step(front.measured_mb, front.ttft_ms, where="post", color="C0", linewidth=1.2, label="Pareto front")
        n, window = int(first.context_length), window_column(first.window)
        rule = rule_candidate(config.chunk_size.tolist(), n, window, first.layout)
        marks = {"one shot": (n, "C3", "s"), "hand rule": (rule, "C2", "^")}
        colors = iter(("C1", "C4", "C5", "C6"))
        for name, size in choices.get(g, {}).items():
            marks[name] = (size, next(colors), "o")
            if name != "auto":
                share = SHARES[[label(s) for s in SHARES].index(name)]
                ax.axvline(
                    share * float(config.measured_mb[config.chunk_size == n].iloc[0]),
                    color=marks[name][1],
                    linestyle=":",
                    linewidth=0.8,
                )
        for name, (size, color, marker) in marks.items():
            hit = config[config.chunk_size == size]  # none: refused, or no one shot on a ring
            ax.scatter(
                hit.measured_mb, hit.ttft_ms, s=60, facecolors="none", edgecolors=color, marker=marker, label=name
            )
        ax.set_title(f"{first.model.split('/')[-1][:18]} {first.backend} {first.attn_impl} n={n}", fontsize=7)
        ax.set_xscale("log")
        ax.tick_params(labelsize=6)
        ax.set_xlabel("peak memory above the model, MB", fontsize=6)
        ax.set_ylabel("TTFT, ms", fontsize=6)
    for ax in list(axes.flat)[len(configs) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7)
    # fixed margins (inches): matplotlib's tight layout measures every tick label of every panel,
    # seconds a figure of a few dozen panels, at each save
    width, height = fig.get_size_inches()
    fig.subplots_adjust(
        left=0.55 / width, right=1 - 0.15 / width, bottom=0.75 / height, top=1 - 0.3 / height, wspace=0.35, hspace=0.55
    )
    return fig
