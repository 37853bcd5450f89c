"""How close the engine's prefills come to this machine's matmul peak, and what the chunk size is
still worth: for every profiled config, the prompt's own FLOPs (chunkpilot.features.prefill_flops:
projections, MLP and the attention each query sees, whatever the chunking) over the prefill's
measured time at the best chunk size and in one shot, against the matmul peak the measuring process
reached (the row's `matmul_peak_gflops`; rows older than harness 6 have only the machine's cached
descriptor `matmul_gflops`, marked *). Under a window the prompt outgrows, one shot over the best
size (whether the window's saving is real); and the share of total TTFT that the measured best
saves over fixed 1024 and over the hand rule (the oracle's saving, profiler.summary's scoring).
Per spec, machine, backend, attention kernel, dtype and threads.

    .venv/bin/python bench/efficiency.py [--data data/ttft] [--by-shape]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.contract import MAX_CONTEXT
from chunkpilot.features import prefill_flops
from chunkpilot.paths import DATA_ROOT
from profiler.summary import summarize_configs
from store.dataset import read_dataset

GROUP = ["spec_name", "hardware_id", "backend", "attn_impl", "dtype", "threads"]


def efficiency(rows: pd.DataFrame) -> pd.DataFrame:
    """Per config: achieved GFLOP/s and the share of the matmul peak at its best size and in one
    shot, one shot over the best size, and the TTFT of the best, of fixed 1024 and of the rule."""
    rows = rows[rows.spec_name != "telemetry"].reset_index(drop=True)  # single prefills: no best size
    measured_peak = rows.matmul_peak_gflops.notna()
    rows = rows.assign(
        achieved=prefill_flops(rows) / 1e9 / (rows.prefill_ms / 1e3),
        peak=rows.matmul_peak_gflops.where(measured_peak, rows.matmul_gflops),
        measured_peak=measured_peak,
    )
    summary = summarize_configs(rows).set_index("config_key")
    out = []
    for key, config in rows.groupby("config_key"):
        best = config.loc[config.ttft_ms.idxmin()]
        one_shot = config[config.is_full]
        s = summary.loc[key]
        out.append(
            {
                **{name: best[name] for name in GROUP},
                "config": key,
                "model": best.model,
                "context_length": best.context_length,
                "windowed": 0 < best.window < best.context_length,  # a window the prompt outgrows
                "measured_peak": bool(best.measured_peak),
                "peak": best.peak,
                "best_gflops": best.achieved,
                "best_of_peak": best.achieved / best.peak,
                "one_shot_of_peak": one_shot.achieved.max() / best.peak if len(one_shot) else np.nan,
                "one_shot_over_best": one_shot.ttft_ms.min() / best.ttft_ms if len(one_shot) else np.nan,
                "best_ms": s.best_ttft_ms,
                "fixed_1024_ms": s.best_ttft_ms * (1 + s.regret_1024),
                "rule_ms": s.best_ttft_ms * (1 + s.regret_rule),
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help=f"dataset root (default {DATA_ROOT})")
    parser.add_argument("--by-shape", action="store_true", help="also best/peak per model and prompt length")
    args = parser.parse_args()
    table = efficiency(read_dataset(args.data))
    print(
        f"{'spec':<15}{'machine':<14}{'backend':<14}{'kernel':<8}{'dtype':<10}{'thr':>4}{'configs':>8}"
        f"{'GFLOP/s':>8}{'peak':>6}   best/peak p10 p50 p90  1-shot/peak   windowed 1-shot/best p50 p90"
        f"   best saves vs 1024, vs rule"
    )
    for (spec, machine, backend, kernel, dtype, threads), g in table.groupby(GROUP):
        q = g.best_of_peak.quantile([0.1, 0.5, 0.9]).tolist()
        windowed = g[g.windowed & g.one_shot_over_best.notna()].one_shot_over_best
        w = f"{windowed.median():>5.2f} {windowed.quantile(0.9):>5.2f}" if len(windowed) else f"{'-':>5} {'-':>5}"
        mark = "" if g.measured_peak.all() else "*"
        saved_1024 = 1 - g.best_ms.sum() / g.fixed_1024_ms.sum()
        saved_rule = 1 - g.best_ms.sum() / g.rule_ms.sum()
        print(
            f"{spec:<15}{machine:<14}{backend:<14}{kernel:<8}{dtype:<10}{threads:>4}{len(g):>8}"
            f"{g.best_gflops.median():>8.1f}{g.peak.median():>5.0f}{mark:<1}  "
            f"{q[0]:>12.0%} {q[1]:>3.0%} {q[2]:>3.0%}{g.one_shot_of_peak.median():>13.0%}"
            f"{'':>15}{w}{saved_1024:>17.1%} {saved_rule:>7.1%}"
        )
    if args.by_shape:
        by_shape(table)


LENGTHS = [0, 1024, 4096, 8192, MAX_CONTEXT]


def by_shape(table: pd.DataFrame) -> None:
    """Median best/peak per model and per prompt-length band, within each group: where a target is missed."""
    for group, g in table.groupby(GROUP):
        print(f"\n{' '.join(map(str, group))}: median best/peak")
        for model, m in g.groupby("model"):
            print(f"  {model:<32}{len(m):>4} configs {m.best_of_peak.median():>5.0%}")
        bands = pd.cut(g.context_length, LENGTHS)
        for band, b in g.groupby(bands, observed=True):
            print(f"  {str(band) + ' tokens':<32}{len(b):>4} configs {b.best_of_peak.median():>5.0%}")


if __name__ == "__main__":
    main()
