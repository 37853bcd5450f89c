"""Does the chunk size matter for this model, backend and machine? For every profiled config of a
spec: the measured best size and its TTFT, the spread (the slowest size over the best), and the
regret of one shot, of the backend's default and of the best single size of its machine, backend
and kernel (chosen from that spec's rows, as one sweep would choose it), with the share of the
matmul peak the prefill reached at its best size. Then per backend and kernel (and llama.cpp's
quantisation): the mean and the largest regret of each baseline, so "chunking does not pay here"
reads as a number. Appends its record to results/runs.jsonl (evaluation.records), from which
docs/backends.md's table is rendered.

    .venv/bin/python bench/chunking_pays.py --spec real-shapes [--data data/ttft]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from chunkpilot.paths import DATA_ROOT
from evaluation.records import append_record, chunking_record
from judge.lineup import anchor_key, backend_default, best_single_size, describe
from store.dataset import anchor_configs, measured_configs, read_dataset


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per config (and machine): its best size and each baseline's regret."""
    best_single = {key: best_single_size(configs) for key, configs in anchor_configs(rows).items()}
    firsts = rows.drop_duplicates(["config_key", "hardware_id"]).set_index(["config_key", "hardware_id"])
    at_best = rows.loc[rows.groupby(["config_key", "hardware_id"]).ttft_ms.idxmin()].set_index(
        ["config_key", "hardware_id"]
    )
    lines = []
    for (config, hardware), measured in measured_configs(rows).items():
        first, best = firsts.loc[(config, hardware)], at_best.loc[(config, hardware)]
        single = best_single[anchor_key(hardware, first.backend, first.attn_impl)]
        lines.append(
            {
                "hardware_id": hardware,
                "model": Path(first.model).stem,
                "backend": first.backend,
                "kernel": first.attn_impl if first.backend != "llama.cpp" else f"{first.quant} {first.attn_impl}",
                "dtype": first["dtype"],
                "n": int(first.context_length),
                "window": f"{first.window}{first.layout[0]}" if first.window else "none",
                "best": int(best.chunk_size) if not best.is_full else "full",
                "best_ms": float(best.ttft_ms),
                "spread": max(measured.ttft_ms) / min(measured.ttft_ms) - 1,
                "one_shot": measured.regret("full"),
                "default": measured.regret(backend_default(first.backend).spec),
                "best_single": measured.regret(single),
                "single": describe(single),
                "peak_share": float(best.prefill_gflops / best.matmul_peak_gflops),  # the row's achieved GFLOP/s
            }
        )
    return pd.DataFrame(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="real-shapes", help="the spec whose rows to read")
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    args = parser.parse_args()
    rows = read_dataset(args.data / args.spec)
    configs = table(rows)
    pd.set_option("display.width", 200)
    pct = {name: "{:+.1%}".format for name in ("spread", "one_shot", "default", "best_single")}
    print(configs.to_string(index=False, formatters={**pct, "best_ms": "{:.0f}".format, "peak_share": "{:.0%}".format}))
    command = shlex.join([".venv/bin/python", "bench/chunking_pays.py", *sys.argv[1:]])
    record = chunking_record(command, args.spec, configs)
    print("\nper backend and kernel: mean (max) regret of each baseline over the configs")
    for g in record["groups"]:
        said = ", ".join(
            f"{name} {g['regret'][key][0]:.1%} ({g['regret'][key][1]:.1%})"
            for name, key in (("one shot", "one_shot"), ("default", "default"), ("best single", "best_single"))
        )
        place = f"{g['hardware_id']} {g['backend']} {g['kernel']}"
        print(f"{place}: {g['configs']} configs, spread {g['spread']:.1%}; {said}")
    where = append_record(record)
    print(f"recorded in {where} (`chunkpilot results` renders docs/backends.md)")


if __name__ == "__main__":
    main()
