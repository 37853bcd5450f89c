"""Profiling specs: YAML sweeps (a pydantic model, so a bad value names its field) expanded into
configs (everything but the chunk size), and the chunk-size candidates each config can run."""

from __future__ import annotations

import hashlib
import itertools
import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks
from chunkpilot.contract import (
    MAX_CONTEXT,
    AttentionConfig,
    AttnImpl,
    Backend,
    ConfigError,
    Contract,
    Dtype,
    Quant,
    check_attn_impl,
    default_attn_impl,
)
from engine.workload import Workload

Length = Annotated[int, Field(ge=1, le=MAX_CONTEXT)]


class ProfileConfig(Contract):
    """One point of the sweep: every candidate chunk size is measured for it."""

    model: str  # preset, checkpoint folder or shape file
    context_length: Length
    window: int | None
    layout: Literal["none", "shift", "ring"]  # "none" (NO_WINDOW) without a window: the key hashes it
    sinks: int
    dtype: Dtype
    threads: int
    attn_impl: AttnImpl
    global_tokens: int = 0  # spread evenly over the prompt by the engine
    backend: Backend = "chunkpilot"  # what runs the prefill (engine.backends)
    quant: Quant | None = None  # llama.cpp's GGUF weights (None: f32)

    @property
    def attention(self) -> AttentionConfig:
        return AttentionConfig.from_columns(self.window, self.layout, self.sinks, self.global_tokens)

    @property
    def workload(self) -> Workload:
        """What the engine prefills for this config: synthetic text of its length."""
        return Workload(self.context_length, self.attention)

    @property
    def key(self) -> str:
        """Stable and file-name safe: a readable prefix plus a hash of every field (without the
        fields added later at their defaults, no global tokens and the bundled engine: keys from
        before they existed stay the same, and so does resuming)."""
        later = {"global_tokens": 0, "backend": "chunkpilot", "quant": None}
        fields = self.model_dump(exclude={name for name, default in later.items() if getattr(self, name) == default})
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        name = Path(self.model).stem.replace("_", "-")[:24]
        g = f"g{self.global_tokens}" if self.global_tokens else ""
        b = "" if self.backend == "chunkpilot" else f"{self.backend.replace('.', '')}-"
        q = f"-{self.quant}" if self.quant else ""
        return f"{b}{name}{q}-n{self.context_length}-w{self.window or 0}{self.layout[0]}{self.sinks}{g}-{digest}"

    def candidates(self, sizes: tuple[int | str, ...]) -> tuple[list[int], list[str]]:
        """(feasible chunk sizes, reasons for the others). `full` is the context length itself."""
        return feasible_chunks(sizes, self.context_length, self.window, self.layout)


def _runs(attn_impl: AttnImpl, backend: Backend, device: str) -> bool:
    try:
        check_attn_impl(attn_impl, backend, device)
    except ConfigError:
        return False
    return True


class Contexts(Contract):
    """`count` lengths from `min` to `max`, log-spaced, rounded to multiples of 8 (not only powers of 2)."""

    min: Length
    max: Length
    count: int = Field(ge=1, le=1000)

    @model_validator(mode="after")
    def _ordered(self) -> Contexts:
        if self.max < self.min:
            raise ConfigError("max", f"must be >= min ({self.min}); got {self.max}")
        return self

    @property
    def lengths(self) -> list[int]:
        if self.count == 1:
            return [self.min]
        points = {self.min, self.max}
        for i in range(1, self.count - 1):
            x = self.min * (self.max / self.min) ** (i / (self.count - 1))
            points.add(max(self.min, min(self.max, int(round(x / 8) * 8))))
        return sorted(points)


class Sweep(Contract):
    """Every combination of these levels is a config."""

    models: list[str] = Field(min_length=1)
    contexts: Annotated[list[Length], Field(min_length=1)] | Contexts
    attention: list[AttentionConfig] = Field(default=[AttentionConfig()], min_length=1)
    dtypes: list[Dtype] = Field(default=["float32"], min_length=1)
    threads: list[Annotated[int, Field(ge=1, le=1024)]] = Field(default=[1], min_length=1)
    attn_impls: list[AttnImpl] | None = Field(
        default=None, min_length=1, description="attention kernels (default: each backend's own on the device)"
    )
    backends: list[Backend] = Field(default=["chunkpilot"], min_length=1, description="what runs each prefill")
    quants: list[Quant] | None = Field(
        default=None, min_length=1, description="llama.cpp's GGUF weights (default f32); the other backends ignore it"
    )

    def configs(self, device: str = "cpu") -> list[ProfileConfig]:
        lengths = self.contexts.lengths if isinstance(self.contexts, Contexts) else self.contexts
        levels = itertools.product(self.models, lengths, self.attention, self.dtypes, self.threads, self.backends)
        return [
            ProfileConfig(
                model, n, att.window, att.row_layout, att.sinks, dtype, threads, impl, att.global_tokens, backend, quant
            )
            for model, n, att, dtype, threads, backend in levels
            for impl in self.attn_impls or [default_attn_impl(backend, device)]
            if _runs(impl, backend, device)
            for quant in (self.quants or [None] if backend == "llama.cpp" else [None])
        ]


class Spec(Contract):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="letters, digits, - and _")
    sweeps: list[Sweep] = Field(min_length=1)
    device: Literal["cpu", "cuda"] = "cpu"
    # space-filling: any prefix covers every level; as-written: the sweeps' order, for a spec whose
    # author ranked them (a short GPU budget: each shape and attention set-up first)
    order: Literal["space-filling", "as-written"] = "space-filling"
    chunk_sizes: tuple[Length | Literal["full"], ...] = DEFAULT_CHUNKS
    repeats: int = Field(default=3, ge=1, le=100)
    warmup: int = Field(default=1, ge=0, le=10)
    cv_threshold: float = Field(default=0.10, gt=0, lt=10, description="re-measure a config whose median CV is above")
    max_remeasure: int = Field(default=2, ge=0, le=10)

    @cached_property
    def configs(self) -> tuple[ProfileConfig, ...]:
        """Every sweep's configs in order, without duplicates across sweeps."""
        return tuple(dict.fromkeys(config for sweep in self.sweeps for config in sweep.configs(self.device)))

    @model_validator(mode="after")
    def _kernels_run_where_asked(self) -> Spec:
        """Each kernel a sweep asks for runs on one of its backends (a sweep over several backends
        measures each on the kernels it runs: llama.cpp's flash and the engine's split apart)."""
        for i, sweep in enumerate(self.sweeps):
            for impl in sweep.attn_impls or []:
                if not any(_runs(impl, backend, self.device) for backend in sweep.backends):
                    try:
                        check_attn_impl(impl, sweep.backends[0], self.device)
                    except ConfigError as exc:
                        raise ConfigError(f"sweeps.{i}.attn_impls", exc.message) from None
        return self

    @classmethod
    def from_dict(cls, data: Any) -> Spec:
        if not isinstance(data, dict):
            raise ConfigError("spec", "must hold a mapping with name and sweeps")
        return cls(**data)

    @classmethod
    def from_file(cls, path: Path) -> Spec:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError("spec", f"cannot read {path}: {str(exc).splitlines()[0]}") from None
        return cls.from_dict(data)
