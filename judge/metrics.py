"""Judging choices, not RMSE: per held-out config, the measured TTFT of the chosen chunk size
against the measured best, fixed 1024 and the hand rule; the metrics per slice of held-out configs
(judge.slices) and as MLflow names them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from chunkpilot.chunks import clamp_chunk, landed, rule_candidate
from chunkpilot.contract import window_column


@dataclass
class HeldOutChoices:
    """A policy's choice for every held-out config of a fold (a recipe's own, one request at a time:
    estimator.recipe.Choice)."""

    chunks: dict[str, int]  # group -> chosen chunk size
    predicted_ms: np.ndarray | None = None  # per test row, for regressors
    deferred: set[str] | None = None  # groups where a do-no-harm recipe took the anchor's size instead


def limited(rows: pd.DataFrame, chunk: int) -> int:
    """A fixed choice cut to what the config allows (ring: <= window; <= context), as the engine does."""
    first = rows.iloc[0]
    return clamp_chunk(chunk, int(first.context_length), window_column(first.window), first.layout)


def rule_chunk(rows: pd.DataFrame) -> int:
    """The hand rule's size among a config's measured candidates."""
    first = rows.iloc[0]
    return rule_candidate(
        rows.chunk_size.tolist(), int(first.context_length), window_column(first.window), first.layout
    )


METRICS = ("mean_regret", "p95_regret", "top1", "within_5pct", "mape", "saved_vs_1024", "saved_vs_rule", "deferred")


def records(rows: pd.DataFrame, choice: HeldOutChoices) -> pd.DataFrame:
    """One record per held-out group of `rows` (a fold's measured rows): the TTFTs of the choice,
    the best, 1024 and the rule."""
    out = []
    for g, r in rows.groupby("group", sort=False):
        chunks, ttft = r.chunk_size.to_numpy(), r.ttft_ms.to_numpy()
        at = dict(zip(chunks, ttft, strict=True))
        n = int(r.context_length.iloc[0])
        out.append(
            {
                "group": g,
                "context_length": n,
                "window": int(r.window.iloc[0]),
                "backend": r.backend.iloc[0],
                "chosen": choice.chunks[g],
                "best_chunk": int(chunks[ttft.argmin()]),
                "ttft_chosen": at[choice.chunks[g]],
                "ttft_best": ttft.min(),
                "ttft_1024": at[landed(chunks, limited(r, 1024))],
                "ttft_rule": at[rule_chunk(r)],
                "deferred": None if choice.deferred is None else g in choice.deferred,
            }
        )
    frame = pd.DataFrame(out)
    frame["regret"] = frame.ttft_chosen / frame.ttft_best - 1
    if choice.predicted_ms is not None:
        errors = np.abs(choice.predicted_ms - rows.ttft_ms.to_numpy()) / rows.ttft_ms.to_numpy()
        frame["ape"] = (
            pd.Series(errors).groupby(rows.group.to_numpy(), sort=False).mean().reindex(frame.group).to_numpy()
        )
    return frame


def _saved(frame: pd.DataFrame, reference: str) -> float:
    """TTFT the choices save against a reference policy, as a fraction of what the best saves."""
    possible = (frame[reference] - frame.ttft_best).sum()
    return float((frame[reference] - frame.ttft_chosen).sum() / possible) if possible > 0 else 1.0


def summarize_regret(frame: pd.DataFrame) -> dict[str, float]:
    return {
        "mean_regret": float(frame.regret.mean()),
        "p95_regret": float(frame.regret.quantile(0.95)),
        "top1": float((frame.chosen == frame.best_chunk).mean()),
        "within_5pct": float((frame.regret <= 0.05).mean()),
        "mape": float(frame.ape.mean()) if "ape" in frame else float("nan"),
        "saved_vs_1024": _saved(frame, "ttft_1024"),
        "saved_vs_rule": _saved(frame, "ttft_rule"),
        # how often a do-no-harm policy took the anchor's size (NaN for the others: not logged)
        "deferred": float(frame.deferred.mean()) if frame.deferred.notna().all() else float("nan"),
    }


def slice_metrics(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per slice, and `all`: each metric averaged over the slices (every slice weighs the same).
    With several backends, the family slice per backend too (`family/llama.cpp`: a held-out
    architecture on that engine), outside `all` (its configs are the family slice's already)."""
    per = {name: summarize_regret(sub) for name, sub in frame.groupby("slice", sort=False)}
    everything = {m: float(pd.Series([v[m] for v in per.values()]).mean()) for m in METRICS}
    family = frame[frame.slice == "family"]
    if family.backend.nunique() > 1:
        per |= {f"family/{backend}": summarize_regret(sub) for backend, sub in family.groupby("backend")}
    return per | {"all": everything}


def flat(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    """MLflow metric names, the same for the model and every baseline: `mean_regret` (all
    slices) and `mean_regret.context` (one slice)."""
    out = {}
    for name, values in metrics.items():
        for metric, value in values.items():
            if value == value:  # MLflow refuses NaN (MAPE of a policy that predicts no TTFT)
                out[metric if name == "all" else f"{metric}.{name}"] = value
    return out
