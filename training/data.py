"""The training table: the profiled dataset, checked for what training needs, with features built
by the serving contract (predictor/features.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks
from chunkpilot.contract import MEASURED, descriptor_key, window_column
from chunkpilot.features import INPUT_COLUMNS, build
from estimator.cost_models import Measured
from judge.lineup import MeasuredConfig, anchor_key
from store.dataset import (
    DataError,
    anchor_configs,
    contended,
    latest,
    measured_by_today,
    measured_configs,
    memory_measured,
    read_dataset,
    trusted_telemetry,
)

CONFIG_COLUMNS = (
    "group",
    "config_key",
    "model",
    "family",
    "hardware_id",
    "context_length",
    "window",
    "layout",
    "sinks",
    "dtype",
    "threads",
    "attn_impl",
    "backend",
    "quant",
)


@dataclass
class Table:
    rows: pd.DataFrame  # one row per (group, chunk size), sorted by group then chunk
    x: np.ndarray  # [rows, features]
    y: np.ndarray  # log TTFT ms

    @property
    def configs(self) -> pd.DataFrame:
        """One row per config and machine (a `group`): the fields slices hold out by."""
        sizes = self.rows.groupby("group", sort=False).chunk_size.nunique()
        configs = self.rows.drop_duplicates("group")[list(CONFIG_COLUMNS)].reset_index(drop=True)
        return configs.assign(sizes=configs.group.map(sizes).to_numpy())

    @property
    def best_chunk(self) -> pd.Series:
        """group -> the measured best chunk size."""
        return self.rows.loc[self.rows.groupby("group", sort=False).ttft_ms.idxmin()].set_index("group").chunk_size

    @property
    def measured(self) -> Measured:
        """What a cost model fits on (numpy only, as the service holds it)."""
        chunk_ms = [None if ms is None else np.asarray(ms, dtype=float) for ms in self.rows.chunk_ms]
        rows = self.rows
        memory = rows.prefill_memory_bytes.where(memory_measured(rows), 0).to_numpy(dtype=float)
        return Measured(
            self.x, rows.ttft_ms.to_numpy(), rows.tokenize_ms.to_numpy(), chunk_ms, memory, rows.config_key.to_numpy()
        )

    def measured_configs(self) -> dict[str, MeasuredConfig]:
        """group -> its measured sizes and TTFTs, as judge.lineup scores a baseline."""
        return {f"{config}@{hardware}": m for (config, hardware), m in measured_configs(self.rows).items()}

    @property
    def anchor_configs(self) -> dict[str, list[MeasuredConfig]]:
        """Each machine's configs per backend and kernel: what its anchor is chosen from."""
        return anchor_configs(self.rows)

    def group_keys(self) -> dict[str, str]:
        """group -> the anchor key of its machine, backend and kernel."""
        first = self.rows.drop_duplicates("group")
        return {
            g: anchor_key(h, b, k)
            for g, h, b, k in zip(first.group, first.hardware_id, first.backend, first.attn_impl, strict=True)
        }

    def subset(self, groups) -> Table:
        mask = self.rows.group.isin(groups).to_numpy()
        return Table(self.rows[mask].reset_index(drop=True), self.x[mask], self.y[mask])


def _joined(lists: pd.Series) -> list[float]:
    return [float(x) for values in lists for x in values]


def merge_telemetry(rows: pd.DataFrame) -> pd.DataFrame:
    """Telemetry holds one row per prefill: the rows of one (config, chunk size, machine) become one
    whose times are medians over them, like a profiled row's repeats, spanning their first start and
    their last finish. A config seen at one chunk size only still teaches this machine's TTFT level;
    slices.py never judges a choice on it."""
    seen = rows.spec_name == "telemetry"
    if not seen.any():
        return rows
    keys = ["config_key", "chunk_size", "hardware_id"]
    merged = (
        rows[seen]
        .groupby(keys, sort=False)
        .agg(
            {
                **{c: "first" for c in rows.columns if c not in keys},
                "tokenize_ms": "median",
                "prefill_ms": "median",
                "first_decode_ms": "median",
                "ttft_ms": "median",
                "started_at": "min",
                "finished_at": "max",
                "ttft_repeats_ms": _joined,
                "prefill_repeats_ms": _joined,
                "chunk_ms": lambda lists: np.median(np.stack(lists.to_list()), axis=0).tolist(),
            }
        )
        .reset_index()
    )
    merged["repeats"] = merged.ttft_repeats_ms.map(len)
    return pd.concat([rows[~seen], merged[rows.columns]], ignore_index=True)


MACHINE_AT = ["hardware_id", "dtype", "threads"]  # a machine's descriptors are measured per dtype and threads


def descriptor_medians(rows: pd.DataFrame) -> pd.DataFrame:
    """[(hardware_id, dtype, threads), MEASURED] each machine's descriptors as the model knows them:
    the median of its rows at that dtype and thread count."""
    return rows.groupby(MACHINE_AT)[list(MEASURED)].median()


def profiled_descriptors(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows, telemetry described as the service describes its requests: a machine profiled at
    the row's dtype and threads by its profiled descriptors (the median of its profiled rows, as
    `hardware_table` and estimator.decide.resolve_hardware give them), not by the engine's own
    cached measurement, which the service never reads for such a machine (measured beside other
    work, one read this machine at a third of its GFLOP/s): training sees the features serving
    computes."""
    seen = (rows.spec_name == "telemetry").to_numpy()
    if not seen.any() or seen.all():
        return rows
    profiled = descriptor_medians(rows[~seen])
    found = profiled.reindex(pd.MultiIndex.from_frame(rows.loc[seen, MACHINE_AT])).to_numpy()  # [telemetry rows, 3]
    known = ~np.isnan(found).any(axis=1)
    out = rows.copy()
    out.loc[rows.index[seen][known], list(MEASURED)] = found[known]
    return out


def load_table(path: Path, older_engines: bool = False, telemetry_through: pd.Timestamp | None = None) -> Table:
    """Read and check the dataset (exit-2 errors name what is wrong), then build the features. Rows
    measured by code of their kernel that no longer runs (store.dataset.KERNEL_SINCE) are left
    out, saying how many, unless `older_engines`; so are rows timed beside other work
    (store.dataset.contended), always; and the engine's prefills that finished after
    `telemetry_through`, if given (the telemetry a model trained then had: training.promotion)."""
    if not Path(path).exists():
        raise DataError("data", f"{path} does not exist")
    rows = read_dataset(Path(path))
    if telemetry_through is not None:
        rows = rows[(rows.spec_name != "telemetry") | (rows.finished_at <= telemetry_through)]
    rows, refused = trusted_telemetry(rows)
    if refused:
        print(f"{len(refused)} telemetry rows refused (first: {refused[0]})", file=sys.stderr, flush=True)
    today = measured_by_today(rows)
    if not older_engines and not today.all():
        older = rows[~today].groupby(["hardware_id", "backend", "attn_impl"]).size()
        said = ", ".join(f"{n} {k} of {b} on {h}" for (h, b, k), n in older.items())
        print(f"left out {len(rows) - today.sum()} rows measured by an older engine ({said})", file=sys.stderr)
        rows = rows[today]
    busy = contended(rows)
    if busy.any():
        said = ", ".join(f"{n} on {h}" for h, n in rows[busy].groupby("hardware_id").size().items())
        print(f"left out {busy.sum()} rows timed beside other work ({said})", file=sys.stderr)
        rows = rows[~busy]
        if rows.empty:
            raise DataError("data", f"every row of {path} was timed beside other work: measure on a quiet machine")
    rows = merge_telemetry(profiled_descriptors(rows))
    configs = rows.config_key.nunique()
    if configs < 2:
        raise DataError("data", f"{path} holds one config only ({rows.config_key.iloc[0]}): nothing to hold out")
    if rows.chunk_size.nunique() < 2:
        raise DataError(
            "data", f"every row of {path} has chunk size {rows.chunk_size.iloc[0]}: nothing to choose between"
        )
    duplicated = rows.duplicated(["config_key", "chunk_size", "hardware_id", "spec_name"])
    if duplicated.any():
        row = rows[duplicated].iloc[0]
        raise DataError("data", f"{path}: config {row.config_key} has chunk size {row.chunk_size} twice")
    return table_of(latest(rows))


def table_of(rows: pd.DataFrame) -> Table:
    """Checked rows -> groups (a config measured on one machine), sorted, with their features."""
    rows = rows.assign(group=rows.config_key + "@" + rows.hardware_id)
    rows = rows.sort_values(["group", "chunk_size"], kind="stable").reset_index(drop=True)
    x = build({c: rows[c].to_numpy() for c in INPUT_COLUMNS})
    return Table(rows, x, np.log(rows.ttft_ms.to_numpy()))


def telemetry_since(path: Path, since: pd.Timestamp) -> Table | None:
    """The engine's prefills that finished after `since`, merged per (config, size, machine), only
    the configs measured at two sizes or more: what can judge a choice between models trained
    before `since` (None: nothing to judge on)."""
    rows = profiled_descriptors(read_dataset(Path(path)))
    rows, _ = trusted_telemetry(rows[(rows.spec_name == "telemetry") & (rows.finished_at > since)])
    if rows.empty:
        return None
    rows = merge_telemetry(rows)
    rows = rows[rows.groupby(["config_key", "hardware_id"]).chunk_size.transform("nunique") >= 2]
    return table_of(rows) if len(rows) else None


def every_candidate(table: Table) -> Table:
    """Each config with a row for every chunk size it can run (those the service chooses from):
    measured ones keep their TTFT, the others have none (NaN), so a choice among all candidates
    can be told apart from a choice among the measured."""
    out = []
    for _, r in table.rows.groupby("group", sort=False):
        first = r.iloc[0]
        window = window_column(first.window)
        sizes, _ = feasible_chunks(DEFAULT_CHUNKS, int(first.context_length), window, first.layout)
        measured = dict(zip(r.chunk_size, r.ttft_ms, strict=True))
        out.append(
            pd.DataFrame([first] * len(sizes)).assign(
                chunk_size=sizes, ttft_ms=[measured.get(c, np.nan) for c in sizes]
            )
        )
    return table_of(pd.concat(out, ignore_index=True).drop(columns="group"))


def hardware_table(rows: pd.DataFrame) -> dict:
    """Each machine in the data: its fingerprint and its descriptors per "dtype/threads". Logged
    with the model, so the service can resolve a request's hardware_id (predictor/model.py)."""
    static = ["device_kind", "device_name", "cores", "l2_cache_bytes", "l3_cache_bytes", "memory_bytes"]
    medians = descriptor_medians(rows)
    return {
        str(hardware_id): {
            "static": json.loads(machine[static].iloc[0].to_json()),
            "descriptors": {
                descriptor_key(dtype, threads): json.loads(measured.to_json())
                for (dtype, threads), measured in medians.loc[hardware_id].iterrows()
            },
        }
        for hardware_id, machine in rows.groupby("hardware_id")
    }
