"""Figures logged with each training run (matplotlib, no display)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def regret_cdf(frames: dict[str, pd.DataFrame]) -> plt.Figure:
    """Share of held-out configs whose regret is at most x, one line per policy."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, frame in frames.items():
        regret = np.sort(frame.regret.to_numpy()) * 100
        ax.step(
            regret,
            np.arange(1, len(regret) + 1) / len(regret),
            where="post",
            label=name,
            linewidth=2.5 if name == "lgbm-regressor" else 1.2,
        )
    ax.set(
        xscale="symlog",
        xlabel="regret vs measured best (%)",
        ylabel="share of held-out configs",
        title="Regret on held-out configs (all slices)",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def predicted_vs_measured(predictions: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.loglog(predictions.measured_ms, predictions.predicted_ms, ".", alpha=0.4, markersize=3)
    low, high = (
        predictions[["measured_ms", "predicted_ms"]].min().min(),
        predictions[["measured_ms", "predicted_ms"]].max().max(),
    )
    ax.plot([low, high], [low, high], "k--", linewidth=1)
    ax.set(xlabel="measured TTFT (ms)", ylabel="predicted TTFT (ms)", title="Held-out predictions")
    fig.tight_layout()
    return fig


def best_chunk_heatmap(rows: pd.DataFrame) -> plt.Figure:
    """Median measured-best chunk size per (context length bin, window)."""
    best = rows.loc[rows.groupby("group").ttft_ms.idxmin()]
    bins = 2 ** np.arange(7, 16)
    best = best.assign(context_bin=pd.cut(best.context_length, bins=np.append(bins, np.inf), labels=bins, right=False))
    table = best.pivot_table(
        index="window", columns="context_bin", values="chunk_size", aggfunc="median", observed=False
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    image = ax.imshow(np.log2(table.to_numpy(dtype=float)), aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(table.columns)), [str(c) for c in table.columns], rotation=45)
    ax.set_yticks(range(len(table.index)), ["none" if w == 0 else str(w) for w in table.index])
    for (i, j), value in np.ndenumerate(table.to_numpy(dtype=float)):
        if value == value:
            ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=7, color="white")
    ax.set(xlabel="context length (bin start)", ylabel="window", title="Measured best chunk size (median)")
    fig.colorbar(image, ax=ax, label="log2 chunk size")
    fig.tight_layout()
    return fig
