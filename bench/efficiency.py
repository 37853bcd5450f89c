"""How close the engine's prefills come to this machine's matmul peak: for every profiled config,
the prompt's own FLOPs (chunkpilot.features.prefill_flops: projections, MLP and the attention its
mask keeps, whatever the chunking) over the prefill's measured time at the best chunk size and in
one shot, against the matmul GFLOP/s the profiler measured in the same process (the row's
`matmul_gflops`). Prints the median and the spread per spec, machine, backend, dtype and threads.

    .venv/bin/python bench/efficiency.py [--data data/ttft]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.dataset import read_dataset
from chunkpilot.features import prefill_flops
from chunkpilot.paths import DATA_ROOT

GROUP = ["spec_name", "hardware_id", "backend", "dtype", "threads"]


def efficiency(rows: pd.DataFrame) -> pd.DataFrame:
    """Per config: achieved GFLOP/s and the share of the matmul peak at its best size and in one shot."""
    rows = rows[rows.spec_name != "telemetry"].reset_index(drop=True)  # single prefills: no best size
    rows = rows.assign(achieved=prefill_flops(rows) / 1e9 / (rows.prefill_ms / 1e3))
    out = []
    for key, config in rows.groupby("config_key"):
        best = config.loc[config.ttft_ms.idxmin()]
        one_shot = config[config.is_full]
        out.append(
            {
                **{name: best[name] for name in GROUP},
                "config": key,
                "best_gflops": best.achieved,
                "best_of_peak": best.achieved / best.matmul_gflops,
                "one_shot_of_peak": one_shot.achieved.max() / best.matmul_gflops if len(one_shot) else np.nan,
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help=f"dataset root (default {DATA_ROOT})")
    args = parser.parse_args()
    table = efficiency(read_dataset(args.data))
    print(
        f"{'spec':<15}{'machine':<14}{'backend':<14}{'dtype':<10}{'threads':>8}{'configs':>9}{'GFLOP/s':>9}"
        f"{'peak':>7}   at the best size / peak: p10  p50  p90   one shot / peak: p50"
    )
    for (spec, machine, backend, dtype, threads), g in table.groupby(GROUP):
        q = g.best_of_peak.quantile([0.1, 0.5, 0.9]).tolist()
        peak = (g.best_gflops / g.best_of_peak).median()
        print(
            f"{spec:<15}{machine:<14}{backend:<14}{dtype:<10}{threads:>8}{len(g):>9}{g.best_gflops.median():>9.1f}"
            f"{peak:>7.0f}{'':>27}{q[0]:>4.0%} {q[1]:>4.0%} {q[2]:>4.0%}{g.one_shot_of_peak.median():>23.0%}"
        )


if __name__ == "__main__":
    main()
