"""Judging choices, not RMSE: per held-out config, the measured TTFT of the chosen chunk size
against the measured best, fixed 1024 and the hand rule."""

from __future__ import annotations

import numpy as np
import pandas as pd

from chunkpilot.chunks import landed

from .baselines import HeldOutChoices, limited, rule_chunk
from .data import Table

METRICS = ("mean_regret", "p95_regret", "top1", "within_5pct", "mape", "saved_vs_1024", "saved_vs_rule", "deferred")


def records(test: Table, choice: HeldOutChoices) -> pd.DataFrame:
    """One record per held-out group: the TTFTs of the choice, the best, 1024 and the rule."""
    out = []
    for g, r in test.rows.groupby("group", sort=False):
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
        errors = np.abs(choice.predicted_ms - test.rows.ttft_ms.to_numpy()) / test.rows.ttft_ms.to_numpy()
        frame["ape"] = (
            pd.Series(errors).groupby(test.rows.group.to_numpy(), sort=False).mean().reindex(frame.group).to_numpy()
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
