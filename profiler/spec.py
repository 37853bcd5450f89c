"""Profiling specs: YAML sweeps expanded into configs (everything but the chunk size), and the
chunk-size candidates each config can actually run."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chunkpilot.config import (
    ATTN_IMPLS, DEFAULT_CHUNKS, DTYPES, AttentionConfig, ConfigError, check_choice, check_int, feasible_chunks,
)


@dataclass(frozen=True)
class ProfileConfig:
    """One point of the sweep: every candidate chunk size is measured for it."""

    model: str
    context_length: int
    window: int | None
    layout: str  # none | shift | ring
    sinks: int
    dtype: str
    threads: int
    attn_impl: str

    @property
    def attention(self) -> AttentionConfig:
        return AttentionConfig(self.window, "shift" if self.layout == "none" else self.layout, self.sinks)

    @property
    def key(self) -> str:
        """Stable and file-name safe: a readable prefix plus a hash of every field."""
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        name = Path(self.model).stem.replace("_", "-")[:24]
        return f"{name}-n{self.context_length}-w{self.window or 0}{self.layout[0]}{self.sinks}-{digest}"

    def candidates(self, sizes: tuple[int | str, ...]) -> tuple[list[int], list[str]]:
        """(feasible chunk sizes, reasons for the others). `full` is the context length itself."""
        return feasible_chunks(sizes, self.context_length, self.window, self.layout)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _contexts(value: Any) -> list[int]:
    """A list of lengths, or {min, max, count}: log-spaced, rounded to multiples of 8 (not only powers of 2)."""
    if isinstance(value, dict):
        low = check_int("contexts.min", value.get("min"), 1)
        high = check_int("contexts.max", value.get("max"), low)
        count = check_int("contexts.count", value.get("count"), 1, 1000)
        if count == 1:
            return [low]
        points = {low, high}
        for i in range(1, count - 1):
            x = low * (high / low) ** (i / (count - 1))
            points.add(max(low, min(high, int(round(x / 8) * 8))))
        return sorted(points)
    if not isinstance(value, list) or not value:
        raise ConfigError("contexts", "must be a non-empty list of lengths or {min, max, count}")
    return [check_int("contexts", v, 1) for v in value]


def _attention(value: Any) -> AttentionConfig:
    if not isinstance(value, dict):
        raise ConfigError("attention", f"each entry must be a mapping like {{window: 512, layout: ring, sinks: 4}}; got {value!r}")
    unknown = set(value) - {"window", "layout", "sinks"}
    if unknown:
        raise ConfigError("attention", f"unknown key {sorted(unknown)[0]!r}; allowed: window, layout, sinks")
    return AttentionConfig(value.get("window"), value.get("layout", "shift"), value.get("sinks", 0))


def _list(sweep: dict, name: str, default: list | None = None) -> list:
    value = sweep.get(name, default)
    if not isinstance(value, list) or not value:
        raise ConfigError(name, "must be a non-empty list")
    return value


@dataclass(frozen=True)
class Spec:
    name: str
    configs: tuple[ProfileConfig, ...]
    chunk_sizes: tuple[int | str, ...] = DEFAULT_CHUNKS
    repeats: int = 3
    warmup: int = 1
    cv_threshold: float = 0.10  # re-measure a config whose median CV is above this
    max_remeasure: int = 2
    source: dict = field(default_factory=dict, compare=False)  # the YAML as read, logged with runs

    @classmethod
    def from_file(cls, path: Path) -> Spec:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError("spec", f"cannot read {path}: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError("spec", f"{path} must hold a mapping with name and sweeps")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> Spec:
        name = data.get("name")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError("name", f"must be a name of letters, digits, - and _; got {name!r}")
        sizes = tuple(data.get("chunk_sizes", DEFAULT_CHUNKS))
        for size in sizes:
            if size != "full":
                check_int("chunk_sizes", size, 1)
        configs: dict[ProfileConfig, None] = {}  # ordered, without duplicates across sweeps
        for sweep in _list(data, "sweeps"):
            levels = itertools.product(
                _list(sweep, "models"),
                _contexts(sweep.get("contexts")),
                [_attention(a) for a in _list(sweep, "attention", [{"window": None}])],
                [check_choice("dtypes", d, DTYPES) for d in _list(sweep, "dtypes", ["float32"])],
                [check_int("threads", t, 1, 1024) for t in _list(sweep, "threads", [1])],
                [check_choice("attn_impls", a, ATTN_IMPLS) for a in _list(sweep, "attn_impls", ["sdpa"])],
            )
            for model, n, att, dtype, threads, impl in levels:
                layout = "none" if att.window is None else att.layout
                configs[ProfileConfig(str(model), n, att.window, layout, att.sinks, dtype, threads, impl)] = None
        cv = data.get("cv_threshold", 0.10)
        if not isinstance(cv, (int, float)) or not 0 < cv < 10 or math.isnan(cv):
            raise ConfigError("cv_threshold", f"must be a number in (0, 10); got {cv!r}")
        return cls(
            name=name,
            configs=tuple(configs),
            chunk_sizes=sizes,
            repeats=check_int("repeats", data.get("repeats", 3), 1, 100),
            warmup=check_int("warmup", data.get("warmup", 1), 0, 10),
            cv_threshold=float(cv),
            max_remeasure=check_int("max_remeasure", data.get("max_remeasure", 2), 0, 10),
            source=data,
        )

