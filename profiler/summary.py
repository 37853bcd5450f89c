"""Per-config summary of a dataset: the measured best chunk size against fixed 1024 and the hand
rule, each scored by the lineup's one judge of a baseline on measured sizes
(judge.lineup.MeasuredConfig), as training and the benches score them."""

from __future__ import annotations

import pandas as pd

from chunkpilot.contract import window_column
from judge.lineup import MeasuredConfig


def summarize_configs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per config: best chunk and TTFT, worst/best, and the regret (TTFT / best - 1) of
    fixed 1024 and of the hand rule, each cut to what the config allows as the engine does and
    landing on a measured size."""
    rows = []
    for key, group in df.groupby("config_key", sort=False):
        ttft = dict(zip(group["chunk_size"], group["ttft_ms"], strict=True))
        first = group.iloc[0]
        n, window = int(first["context_length"]), window_column(first["window"])
        measured = MeasuredConfig(list(ttft), list(ttft.values()), n, window, first["layout"])
        best_chunk = min(ttft, key=ttft.get)
        best = ttft[best_chunk]
        rows.append(
            {
                "config_key": key,
                "model": first["model"],
                "context_length": n,
                "window": window or 0,
                "layout": first["layout"],
                "sinks": int(first["sinks"]),
                "global_tokens": int(first.get("global_tokens") or 0),
                "dtype": first["dtype"],
                "threads": int(first["threads"]),
                "attn_impl": first["attn_impl"],
                "backend": first.get("backend") or "chunkpilot",
                "candidates": len(ttft),
                "best_chunk": int(best_chunk),
                "best_ttft_ms": best,
                "worst_over_best": max(ttft.values()) / best,
                "chunk_1024": measured.size("1024"),
                "regret_1024": measured.regret("1024"),
                "rule_chunk": measured.size("rule"),
                "regret_rule": measured.regret("rule"),
                "noisy": bool(group["noisy"].any()),
            }
        )
    return pd.DataFrame(rows)


def format_summary(summary: pd.DataFrame, limit: int = 40) -> str:
    lines = [f"{'config':<44}{'best':>6}{'TTFT ms':>10}{'worst/best':>11}{'1024 regret':>12}{'rule regret':>12}"]
    for r in summary.head(limit).itertuples():
        window = f"{r.window}{r.layout[0]}" if r.window else "none"
        g = f" g={r.global_tokens}" if r.global_tokens else ""
        label = (
            f"{r.model[:16]} n={r.context_length} w={window} s={r.sinks}{g} {r.dtype[:4]} t{r.threads} {r.attn_impl}"
        )
        lines.append(
            f"{label:<44}{r.best_chunk:>6}{r.best_ttft_ms:>10.1f}{r.worst_over_best:>11.2f}"
            f"{r.regret_1024:>12.1%}{r.regret_rule:>12.1%}" + ("  noisy" if r.noisy else "")
        )
    if len(summary) > limit:
        lines.append(f"... {len(summary) - limit} more configs")
    lines.append(
        f"{len(summary)} configs: best differs from 1024 in {(summary.best_chunk != summary.chunk_1024).mean():.0%}, "
        f"from the rule in {(summary.best_chunk != summary.rule_chunk).mean():.0%}; "
        f"mean regret 1024 {summary.regret_1024.mean():.1%} (p95 {summary.regret_1024.quantile(0.95):.1%}), "
        f"rule {summary.regret_rule.mean():.1%} (p95 {summary.regret_rule.quantile(0.95):.1%})"
    )
    return "\n".join(lines)
