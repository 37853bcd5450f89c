"""The TTFT dataset on disk: one Parquet file per finished config under
data/ttft/<spec name>/<hardware id>/ (a spec measured on two machines keeps both).

Each file is written whole and renamed into place, so a kill at any moment leaves either the
finished file or none (a stray temporary file is ignored and removed on the next run). Rows are
checked against the schema when written and when read; a bad row is refused, named.
The schema is documented in data/ttft/SCHEMA.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from annotated_types import Ge, Gt, Le

from chunkpilot import plausibility
from chunkpilot.chunks import chunk_count, last_chunk
from chunkpilot.contract import (
    ATTN_IMPLS,
    BACKENDS,
    DTYPES,
    LAYOUTS,
    NO_WINDOW,
    PRESETS,
    QUANTS,
    AttentionConfig,
    ChunkRequest,
    ConfigError,
    Hardware,
    ModelShape,
    Outcome,
    number,
    window_column,
)
from chunkpilot.paths import TELEMETRY_PREFIX, inside
from judge.lineup import MeasuredConfig, anchor_key

# 2: per-chunk times (`chunk_ms`), 3: `tie_embeddings`, 4: `global_tokens`, 5: `backend` and its
# version, 6: `compiled`, the prefill's GFLOP/s and the matmul peak beside it, 7: llama.cpp's
# `quant`, `n_batch`, `n_ubatch`, 8: `prefill_memory_bytes` (engine.memory), 9: PyTorch's own
# account of it (its allocator's peak, no longer the resident set), 10: the bundled engine's masks
# built without a [Q, K] difference of positions (a shift window's chunk attended in one call held
# 8 bytes a key more at its peak; the memory spec's three such configs, re-measured, peaked the same
# to the byte), its sinks copied and its shift buffer sized with them, 11: `foreign_cores`, the
# other work on the machine while a config was timed (engine.contention); older files read
HARNESS_VERSION = "11"
# A row timed while other work kept more than this many cores busy on average reads slow: the
# profiler measures it again, and training leaves it out (CHUNKPILOT_CONTENDED_CORES overrides it)
CONTENDED_CORES = 0.25
CONTENDED_ENV = "CHUNKPILOT_CONTENDED_CORES"
# The first harness version whose rows today's code of each (backend, kernel) measured: the bundled
# engine's masked and eager kernels changed in bdd8756 (transformers' concatenating cache, 0-23%
# faster, most at small chunks: docs/performance.md), after which version 5 was the first; split
# was born with 6. An older row of that label was measured by code that no longer runs: training
# leaves it out unless asked (`chunkpilot train --older-engines`), and a test keeps it that way.
KERNEL_SINCE: dict[tuple[str, str], int] = {
    ("chunkpilot", "masked"): 5,
    ("chunkpilot", "eager"): 5,
    ("chunkpilot", "split"): 6,
    ("transformers", "masked"): 5,
    ("transformers", "eager"): 5,
    ("llama.cpp", "masked"): 5,
    ("llama.cpp", "flash"): 7,
}
# The first harness version whose `prefill_memory_bytes` today's code of each backend measures: the
# bundled engine and generate read PyTorch's allocator since 9 (the resident set before: glibc's
# arenas moved it by tens of MiB between runs of one size), llama.cpp its own buffers since 8
MEMORY_SINCE: dict[str, int] = {"chunkpilot": 9, "transformers": 9, "llama.cpp": 8}
TMP_PREFIX = ".tmp-"
STALE_TMP_S = 3600.0  # a temporary file this old belongs to no live writer (one batch takes milliseconds)

_int, _float, _str, _bool = pa.int64(), pa.float64(), pa.string(), pa.bool_()
# fmt: off
SCHEMA = pa.schema(
    [
        # the config: everything but the chunk size
        ("config_key", _str), ("spec_name", _str), ("model", _str), ("family", _str),
        ("num_layers", _int), ("hidden_size", _int), ("num_heads", _int), ("num_kv_heads", _int),
        ("head_dim", _int), ("intermediate_size", _int), ("vocab_size", _int), ("global_every", _int),
        ("parameters", _int), ("tie_embeddings", _bool), ("context_length", _int), ("window", _int),
        ("layout", _str), ("sinks", _int), ("global_tokens", _int), ("dtype", _str), ("threads", _int),
        ("attn_impl", _str), ("backend", _str), ("backend_version", _str), ("compiled", _bool),
        # llama.cpp's weights and the batch sizes its context ran with (null for the other backends)
        ("quant", _str), ("n_batch", _int), ("n_ubatch", _int),
        # the hardware it ran on
        ("hardware_id", _str), ("device_kind", _str), ("device_name", _str), ("cores", _int),
        ("l2_cache_bytes", _int), ("l3_cache_bytes", _int), ("memory_bytes", _int),
        ("matmul_gflops", _float), ("bandwidth_gbs", _float), ("call_overhead_ms", _float),
        ("torch_version", _str), ("transformers_version", _str), ("allocator", _str),
        # the candidate and what it measured
        ("chunk_size", _int), ("is_full", _bool), ("num_chunks", _int), ("last_chunk", _int),
        ("tokenize_ms", _float), ("prefill_ms", _float), ("first_decode_ms", _float), ("ttft_ms", _float),
        ("ttft_iqr_ms", _float), ("ttft_cv", _float), ("repeats", _int),
        ("ttft_repeats_ms", pa.list_(_float)), ("prefill_repeats_ms", pa.list_(_float)),
        ("chunk_ms", pa.list_(_float)),
        ("kv_cache_bytes", _int), ("peak_memory_bytes", _int), ("prefill_memory_bytes", _int),
        # the prompt's own FLOPs (chunkpilot.features.prefill_flops) over the median prefill, and the
        # best matmul GFLOP/s the measuring process reached (engine.hardware.matmul_peak)
        ("prefill_gflops", _float), ("matmul_peak_gflops", _float),
        ("noisy", _bool), ("remeasured", _int),
        # cores other processes kept busy while the config was timed (engine.contention; null: not measured)
        ("foreign_cores", _float),
        ("started_at", pa.timestamp("us", tz="UTC")), ("finished_at", pa.timestamp("us", tz="UTC")),
        ("harness_version", _str),
        # telemetry only (the engine's own prefills): where the choice came from
        ("decision_source", _str), ("model_version", _str), ("explored", _bool),
    ]
)
# fmt: on
COLUMNS = SCHEMA.names
LISTS = [f.name for f in SCHEMA if pa.types.is_list(f.type)]  # MLflow dataset schemas hold scalars only
# columns older files (and the profiler's, for the telemetry ones) lack, and what such a row reads as
OPTIONAL = {
    **dict.fromkeys(("chunk_ms", "tie_embeddings", "backend_version", "decision_source", "model_version", "explored")),
    **dict.fromkeys(("compiled", "prefill_gflops", "matmul_peak_gflops", "quant", "n_batch", "n_ubatch")),
    "foreign_cores": None,
    "prefill_memory_bytes": 0,  # 0: not measured (older files, telemetry)
    "global_tokens": 0,
    "backend": "chunkpilot",
}
# (column, lowest allowed, strictly above it?, highest allowed or None) for the numeric checks: the
# contract's own bounds where a column is a field of a request, its machine or its outcome
_CONTRACT = (AttentionConfig, ChunkRequest, ModelShape, Hardware, Outcome)  # the first that names a column
_NONE_AS_ZERO = ("window", "global_every")  # fields that may be None, stored as 0
# fmt: off
_DATASET_ONLY = {
    "parameters": (1, False), "num_chunks": (1, False), "last_chunk": (1, False), "memory_bytes": (0, False),
    "ttft_iqr_ms": (0, False), "ttft_cv": (0, False), "repeats": (1, False), "kv_cache_bytes": (0, False),
    "peak_memory_bytes": (0, False), "prefill_memory_bytes": (0, False), "remeasured": (0, False),
    "prefill_gflops": (0, True), "matmul_peak_gflops": (0, True), "foreign_cores": (0, False),
}
# fmt: on
# rows of older files and telemetry have none
_NULLABLE = ("prefill_gflops", "matmul_peak_gflops", "foreign_cores")


def _bounds() -> dict[str, tuple[float, bool, float | None]]:
    bounds = {name: (low, strict, None) for name, (low, strict) in _DATASET_ONLY.items()}
    for model in _CONTRACT:
        for name, info in model.model_fields.items():
            if name not in SCHEMA.names or name in bounds:
                continue
            low = next(((m.ge, False) for m in info.metadata if isinstance(m, Ge)), None)
            low = low or next(((m.gt, True) for m in info.metadata if isinstance(m, Gt)), None)
            if low is not None:
                high = next((m.le for m in info.metadata if isinstance(m, Le)), None)
                bounds[name] = (0, False, high) if name in _NONE_AS_ZERO else (*low, high)
    return bounds


_BOUNDS = _bounds()
# the contract's names (a row's layout is `none` without a window)
_CHOICES = {
    "layout": (NO_WINDOW, *LAYOUTS),
    "dtype": DTYPES,
    "attn_impl": ATTN_IMPLS,
    "backend": BACKENDS,
    "quant": (None, *QUANTS),
}


class DataError(ConfigError):
    """A dataset file or row that breaks the schema."""


def validate(df: pd.DataFrame, where: str) -> None:
    """Refuse the first bad row with a message naming the file, the row and the rule it breaks."""
    missing = [c for c in COLUMNS if c not in df.columns and c not in OPTIONAL]
    if missing:
        raise DataError("data", f"{where}: missing columns {', '.join(missing)}")
    present = [c for c in COLUMNS if c in df.columns]
    # rows as dicts of Python values, a column's list at a time: itertuples reads every cell through
    # pandas' indexing, most of the time of reading the shipped data
    for i, row in enumerate(zip(*(df[c].tolist() for c in present), strict=True)):
        values = dict(zip(present, row, strict=True))
        for column, (low, strict, high) in _BOUNDS.items():
            if column not in values:  # an optional column an older file lacks
                continue
            v = values[column]
            if column in _NULLABLE and (v is None or (isinstance(v, float) and math.isnan(v))):
                continue
            if v is None or (isinstance(v, float) and math.isnan(v)) or (v <= low if strict else v < low):
                raise DataError(column, f"{where} row {i}: must be {'>' if strict else '>='} {low}, got {v!r}")
            if high is not None and v > high:
                raise DataError(column, f"{where} row {i}: must be <= {high}, got {v!r}")
        for column, allowed in _CHOICES.items():
            value = values.get(column, OPTIONAL.get(column))
            if value not in allowed and not (None in allowed and pd.isna(value)):
                names = ", ".join(str(a) for a in allowed)
                raise DataError(column, f"{where} row {i}: must be one of {names}, got {value!r}")
        n, chunk = values["context_length"], values["chunk_size"]
        if chunk > n or values["num_chunks"] != chunk_count(n, chunk):
            raise DataError(
                "chunk_size", f"{where} row {i}: chunk {chunk} and {values['num_chunks']} chunks do not fit context {n}"
            )
        repeats = values["ttft_repeats_ms"]
        if repeats is None or len(repeats) != values["repeats"] or not all(x > 0 for x in repeats):
            raise DataError(
                "ttft_repeats_ms", f"{where} row {i}: needs {values['repeats']} positive times, got {repeats!r}"
            )
        chunk_ms = values.get("chunk_ms")
        if chunk_ms is not None and (len(chunk_ms) != values["num_chunks"] or not all(x > 0 for x in chunk_ms)):
            raise DataError(
                "chunk_ms",
                f"{where} row {i}: needs {values['num_chunks']} positive chunk times, got {list(chunk_ms)!r}",
            )


def write_config(directory: Path, key: str, rows: pd.DataFrame) -> Path:
    """Validate, then write the config's rows atomically (temporary file, fsync, rename)."""
    validate(rows, f"config {key}")
    rows = with_optional(rows)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{key}.parquet"
    tmp = directory / f"{TMP_PREFIX}{key}-{os.getpid()}.parquet"
    # column by column from Python values: pyarrow's from_pandas trips pandas' tz deprecation
    table = pa.Table.from_pydict(
        {c: pa.array(rows[c].tolist(), type=SCHEMA.field(c).type, from_pandas=True) for c in COLUMNS}, schema=SCHEMA
    )
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return final


def finished_keys(directory: Path) -> set[str]:
    """Configs already on disk; stray temporary files from a killed run are removed."""
    if not directory.is_dir():
        return set()
    for stray in directory.glob(f"{TMP_PREFIX}*"):
        stray.unlink(missing_ok=True)
    return {p.stem for p in directory.glob("*.parquet")}


def read_file(path: Path) -> pd.DataFrame:
    try:
        df = pq.read_table(path).to_pandas()
    except (OSError, pa.ArrowException) as exc:
        raise DataError("data", f"{path} is not a readable Parquet file: {str(exc).splitlines()[0]}") from None
    validate(df, str(path))
    return with_optional(df)


def with_optional(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of an older schema version with the columns it lacked, as `OPTIONAL` says."""
    missing = {c: v for c, v in OPTIONAL.items() if c not in df.columns}
    return df.assign(**missing) if missing else df


def read_dataset(root: Path) -> pd.DataFrame:
    """Every config file under `root` (data/ttft, a spec's folder or one machine's), checked row by row."""
    files = sorted(p for p in Path(root).rglob("*.parquet") if not p.name.startswith(TMP_PREFIX))
    if not files:
        raise DataError("data", f"no dataset files under {root}")
    return pd.concat([read_file(p) for p in files], ignore_index=True)


def model_name(shape: ModelShape) -> str:
    """A preset's name, else a name for the shape (the `model` column that slices hold out by)."""
    for name, preset in PRESETS.items():
        if preset == shape:
            return name
    return f"shape-{hashlib.sha1(shape.model_dump_json().encode()).hexdigest()[:8]}"


def outcome_rows(outcomes: list[Outcome]) -> pd.DataFrame:
    """Outcomes as dataset rows (spec `telemetry`, one repeat each): what training reads."""
    rows = []
    for o in outcomes:
        request, hardware = o.request, o.request.hardware
        config = request.row(hardware.model_dump())
        key = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
        n, c, m = request.context_length, o.chunk_size, len(o.chunk_ms)
        rows.append(
            {
                "config_key": f"{TELEMETRY_PREFIX}n{n}-{key}",
                "spec_name": "telemetry",
                "model": model_name(request.shape),
                "family": request.shape.family,
                **config,
                "hardware_id": hardware.hardware_id or "unnamed",
                "device_kind": "unknown",
                "device_name": "unknown",
                "memory_bytes": 0,
                "torch_version": "",
                "transformers_version": "",
                "allocator": "",
                "chunk_size": c,
                "is_full": c == n,
                "num_chunks": m,
                "last_chunk": last_chunk(n, c),
                "tokenize_ms": o.tokenize_ms,
                "prefill_ms": o.prefill_ms,
                "first_decode_ms": o.first_decode_ms,
                "ttft_ms": o.ttft_ms,
                "ttft_iqr_ms": 0.0,
                "ttft_cv": 0.0,
                "repeats": 1,
                "ttft_repeats_ms": [o.ttft_ms],
                "prefill_repeats_ms": [o.prefill_ms],
                "chunk_ms": o.chunk_ms,
                "kv_cache_bytes": 0,
                "peak_memory_bytes": 0,
                "prefill_memory_bytes": 0,
                "noisy": False,
                "remeasured": 0,
                "foreign_cores": None,
                "started_at": o.finished_at,
                "finished_at": o.finished_at,
                "harness_version": HARNESS_VERSION,
                "decision_source": o.source,
                "model_version": o.model_version,
                "explored": o.explored,
            }
        )
    return pd.DataFrame(rows)


def outcome_of(row: dict) -> Outcome:
    """A telemetry row as the outcome it was written from (the inverse of `outcome_rows`), checked by
    the contract again: a file written around the service passes the same checks as a request."""

    def given(column: str):  # a missing telemetry column reads back as None, NaN or NA
        value = row.get(column)
        return None if value is None or pd.isna(value) else value

    return Outcome(
        request=ChunkRequest.from_row(row),
        chunk_size=row["chunk_size"],
        source=given("decision_source") or "service",
        model_version=given("model_version"),
        explored=bool(given("explored")),
        tokenize_ms=row["tokenize_ms"],
        prefill_ms=row["prefill_ms"],
        first_decode_ms=row["first_decode_ms"],
        ttft_ms=row["ttft_ms"],
        chunk_ms=list(row["chunk_ms"]) if row["chunk_ms"] is not None else [],
        finished_at=row["finished_at"],
    )


def trusted_telemetry(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(the rows less the telemetry ones the contract or the plausibility check refuses, why each
    refused one was): what the service would have refused never reaches training or the correction.
    Profiled rows pass as they are."""
    telemetry = rows.spec_name == "telemetry"
    refused: dict = {}
    for index, row in zip(rows.index[telemetry], rows[telemetry].to_dict("records"), strict=True):
        try:
            plausibility.check(outcome_of(row))
        except ConfigError as exc:
            refused[index] = f"{row['config_key']} chunk {row['chunk_size']}: {exc}"
    return rows.drop(index=list(refused)), list(refused.values())


@dataclass
class Partition:
    """The telemetry partition: each accepted batch one atomic file per machine, in a folder named
    by the machine's id and checked to stay inside `directory` (chunkpilot.paths), the oldest files
    removed while the partition holds more than `max_bytes`, and temporary files that a killed
    writer left behind swept once they are older than STALE_TMP_S."""

    directory: Path
    max_bytes: int = 256 * 2**20

    def append(self, outcomes: list[Outcome]) -> list[Path]:
        rows = outcome_rows(outcomes)
        folders = {hardware_id: inside(self.directory, hardware_id) for hardware_id in rows.hardware_id.unique()}
        written = [
            write_config(folders[hardware_id], f"batch-{time.time_ns()}-{os.getpid()}", group)
            for hardware_id, group in rows.groupby("hardware_id", sort=False)
        ]
        self._sweep()
        return written

    def _sweep(self) -> None:
        """Evict the oldest batches beyond the cap and stale temporary files. Another writer (a
        second replica on this folder) may remove a file first: one that is gone is skipped."""
        files, now = [], time.time()
        for path in self.directory.rglob("*.parquet"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if path.name.startswith(TMP_PREFIX):
                if now - st.st_mtime > STALE_TMP_S:
                    path.unlink(missing_ok=True)
            elif path.name.startswith("batch-"):
                files.append((st.st_mtime_ns, st.st_size, path))
        files.sort()
        total = sum(size for _, size, _ in files)
        for _, size, oldest in files:  # oldest first
            if total <= self.max_bytes:
                break
            total -= size
            oldest.unlink(missing_ok=True)


def measured_by_today(rows: pd.DataFrame) -> pd.Series:
    """Whether each row was measured by today's code of its backend and kernel (KERNEL_SINCE); the
    engine's own telemetry always was."""
    since = [KERNEL_SINCE.get((b, k), 0) for b, k in zip(rows.backend, rows.attn_impl, strict=True)]
    versions = pd.to_numeric(rows.harness_version, errors="coerce").fillna(0).to_numpy()
    return pd.Series(versions >= since, index=rows.index) | (rows.spec_name == "telemetry")


def contended_limit() -> float:
    """The cores of other work above which a config's timing is not trusted (CONTENDED_CORES, or
    the environment's CHUNKPILOT_CONTENDED_CORES)."""
    return number(CONTENDED_ENV, os.environ.get(CONTENDED_ENV, CONTENDED_CORES), float, ge=0)


def contended(rows: pd.DataFrame) -> pd.Series:
    """Whether each row was timed while other work kept more than `contended_limit()` cores busy
    (unknown for older rows and telemetry: not contended)."""
    if "foreign_cores" not in rows:
        return pd.Series(False, index=rows.index)
    return pd.to_numeric(rows.foreign_cores, errors="coerce").fillna(0) > contended_limit()


def memory_measured(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's `prefill_memory_bytes` was measured, by today's method of its backend
    (MEMORY_SINCE): what a memory model fits on."""
    since = rows.backend.map(MEMORY_SINCE).fillna(HARNESS_VERSION).astype(int)
    versions = pd.to_numeric(rows.harness_version, errors="coerce").fillna(0)
    return (rows.prefill_memory_bytes.fillna(0) > 0) & (versions >= since)


def measured_configs(rows: pd.DataFrame) -> dict[tuple[str, str], MeasuredConfig]:
    """(config_key, hardware_id) -> its measured sizes and TTFTs, as judge.lineup scores a
    baseline on them."""
    return {
        key: MeasuredConfig(
            r.chunk_size.tolist(),
            r.ttft_ms.tolist(),
            int(r.context_length.iat[0]),
            window_column(r.window.iat[0]),
            r.layout.iat[0],
        )
        for key, r in rows.groupby(["config_key", "hardware_id"], sort=False)  # a row's Series: slow
    }


def latest(rows: pd.DataFrame) -> pd.DataFrame:
    """Each size of a config on a machine once: its latest measurement (a config that two specs both
    measured, a demo's profile and a shipped spec)."""
    return rows.sort_values("finished_at", kind="stable").drop_duplicates(
        ["config_key", "chunk_size", "hardware_id"], keep="last"
    )


def anchor_configs(rows: pd.DataFrame) -> dict[str, list[MeasuredConfig]]:
    """Each machine's sweep per backend and kernel (judge.lineup.anchor_key): its profiled configs
    measured by today's code on a quiet machine, each size's latest. What its best single size and
    its anchor are chosen from, by training and by the race alike. The engine's telemetry is not a
    sweep: it measured the sizes `auto` chose."""
    swept = latest(rows[measured_by_today(rows) & ~contended(rows) & (rows.spec_name != "telemetry")])
    firsts = swept.drop_duplicates(["config_key", "hardware_id"]).set_index(["config_key", "hardware_id"])
    out: dict[str, list[MeasuredConfig]] = {}
    for (config, hardware), measured in measured_configs(swept).items():
        first = firsts.loc[(config, hardware)]
        out.setdefault(anchor_key(hardware, first.backend, first.attn_impl), []).append(measured)
    return out
