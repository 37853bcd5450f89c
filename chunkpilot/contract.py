"""The one request contract: model shape, attention set-up, hardware and the request, as pydantic
models whose bounds are stated once. The engine builds them, its client sends them, the service
validates the same classes (a 422 naming the field), the profiler writes dataset rows from them,
and the feature builder reads those rows. Light: no torch, no transformers, no lightgbm.

Built in Python (by name, or positionally in field order like a dataclass), a bad value raises a
ConfigError naming the field, which the CLI prints as one line."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator

from .chunks import MAX_CONTEXT, chunk_count, clamp_chunk, max_chunk

Family = Literal["llama", "mistral", "qwen2", "gemma3"]
Layout = Literal["shift", "ring"]
Dtype = Literal["float32", "bfloat16"]
# split: only the keys a query sees, blocks merged by log-sum-exp (the bundled engine on a CPU);
# masked: a dense mask [Q, K] through PyTorch's SDPA (llama.cpp: its default, scores of every cached
# key masked); eager: the model's own kernel; flash: llama.cpp's flash attention (flash_attn on)
AttnImpl = Literal["split", "masked", "eager", "flash"]
# what runs the prefill: the bundled engine, stock transformers generate(), a llama.cpp context
Backend = Literal["chunkpilot", "transformers", "llama.cpp"]
# llama.cpp's weights: f32, or quantised by llama.cpp's own quantizer (the other backends run `Dtype`)
Quant = Literal["f32", "f16", "bf16", "q8_0", "q4_k_m"]
FAMILIES, LAYOUTS, DTYPES, ATTN_IMPLS, BACKENDS, QUANTS = (
    t.__args__ for t in (Family, Layout, Dtype, AttnImpl, Backend, Quant)
)


NO_WINDOW = "none"  # the dataset's and the spec's layout without a window (the contract's is window=None)
MAX_CANDIDATES = 64
MAX_GLOBAL_TOKENS = 1024  # the global-token store's cap: a ring's KV memory stays within 2*window + sinks + this
MAX_MS = 3.6e6  # an hour: the longest time any part accepts
MAX_MEMORY_MB = 1 << 24  # 16 TiB: the largest memory budget any part accepts
# a machine's id names a folder of the dataset: one path component, never `..`, `/` or an absolute path
IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


_UNION_MEMBER = re.compile(r"^(str|int|float|bool)$|[A-Z\[\]'-]")  # pydantic's names for a union's members


class ConfigError(ValueError):
    """Bad user input: names the field and what is allowed (the CLI prints it as one line)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message

    def __reduce__(self) -> tuple:  # pickled as built (from a child process: engine/isolation.py)
        return type(self), (self.field, self.message)

    @classmethod
    def of(cls, exc: ValidationError, field: str = "") -> ConfigError:
        """pydantic's first error as one ConfigError: the field's dotted path and pydantic's message.
        An unknown field goes first (a misspelt name explains the "missing" one); a union member of
        the wrong type (`model` given as fields is not a preset name) last."""
        errors = exc.errors(include_url=False)
        error = min(errors, key=lambda e: (e["type"] != "extra_forbidden", e["type"].endswith("_type")))
        path = [field] if field else []
        path += [str(part) for part in error["loc"] if not _UNION_MEMBER.search(str(part))]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigError):  # our own cross-field check names its field itself
            return cls(".".join([*path, cause.field]), cause.message)
        kind = error["type"]
        message = {"missing": "is required", "extra_forbidden": "unknown field"}.get(kind, error["msg"])
        if kind not in ("missing", "extra_forbidden"):
            message += f"; got {error['input']!r}"
        return cls(".".join(path) or "value", message)


def default_attn_impl(backend: Backend, device: str = "cpu") -> AttnImpl:
    """split where it runs (the bundled engine on a CPU: torch's CPU flash kernel with log-sum-exp),
    else the dense mask."""
    return "split" if backend == "chunkpilot" and device == "cpu" else "masked"


def check_attn_impl(attn_impl: AttnImpl, backend: Backend, device: str = "cpu") -> None:
    if attn_impl == "split" and default_attn_impl(backend, device) != "split":
        raise ConfigError(
            "attn_impl",
            f"split runs in the chunkpilot backend on cpu (torch's CPU flash kernel); for backend {backend} "
            f"on {device} use masked or eager",
        )
    if attn_impl == "flash" and backend != "llama.cpp":
        raise ConfigError(
            "attn_impl", f"flash is llama.cpp's flash attention; backend {backend} runs split, masked or eager"
        )
    if attn_impl == "eager" and backend == "llama.cpp":
        raise ConfigError("attn_impl", "llama.cpp runs masked (its default: flash attention off) or flash")


def check_quant(quant: Quant | None, backend: Backend) -> None:
    if (quant is None) != (backend != "llama.cpp"):
        raise ConfigError(
            "quant",
            f"only the llama.cpp backend runs quantised weights ({', '.join(QUANTS)}); the others run "
            f"their dtype; got {quant} for backend {backend}",
        )


def number(
    field: str,
    value: Any,
    kind: type[int] | type[float],
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> Any:
    """A CLI number (a string is fine) checked against pydantic bounds; the error shows the range."""
    try:
        bounded = Annotated[kind, Field(ge=ge, gt=gt, le=le, allow_inf_nan=False)]
        return TypeAdapter(bounded).validate_python(value)
    except ValidationError:
        low = f"[{ge:g}" if ge is not None else f"({gt:g}"
        allowed = f"in {low}, {le:g}]" if le is not None else f"{'>=' if ge is not None else '>'} {low[1:]}"
        what = "an integer" if kind is int else "a number"
        raise ConfigError(field, f"must be {what} {allowed}; got {value!r}") from None


class Contract(BaseModel):
    """Frozen and closed (unknown fields are errors), so equal requests hash alike."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, *args: Any, **data: Any) -> None:
        if len(args) > len(type(self).model_fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(type(self).model_fields)} positional values")
        data.update(zip(list(type(self).model_fields)[: len(args)], args, strict=True))  # positional, in order
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError.of(exc) from None


class ModelShape(Contract):
    """Everything about a decoder-only model that decides its prefill cost."""

    family: Family = Field(description="the architecture: " + ", ".join(FAMILIES))
    num_layers: int = Field(ge=1, le=1024, description="decoder layers")
    hidden_size: int = Field(ge=1, le=65536, description="the residual stream's width")
    num_heads: int = Field(ge=1, le=1024, description="query heads")
    num_kv_heads: int = Field(ge=1, le=1024, description="key/value heads (fewer than num_heads: grouped-query)")
    intermediate_size: int = Field(ge=1, le=1 << 20, description="the MLP's inner width")
    vocab_size: int = Field(ge=2, le=1 << 22, description="vocabulary size")
    head_dim: int | None = Field(default=None, ge=1, le=4096, description="None: hidden_size // num_heads")
    max_position: int = Field(default=32768, ge=2, le=MAX_CONTEXT, description="the longest context it takes")
    window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT, description="the model's own sliding window")
    global_every: int | None = Field(default=None, ge=1, le=1024, description="every k-th layer global, others local")
    tie_embeddings: bool | None = Field(default=None, description="LM head shares the embeddings; None: gemma3 only")

    @model_validator(mode="after")
    def _consistent(self) -> ModelShape:
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    "hidden_size", f"must be a multiple of num_heads ({self.num_heads}) unless head_dim is set"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", f"must divide num_heads ({self.num_heads}); got {self.num_kv_heads}")
        if self.global_every is not None and self.global_every > self.num_layers:
            raise ConfigError(
                "global_every", f"must be in [1, num_layers ({self.num_layers})]; got {self.global_every}"
            )
        if self.tie_embeddings is None:
            object.__setattr__(self, "tie_embeddings", self.family == "gemma3")
        return self

    @property
    def parameters(self) -> int:
        """Parameter count of the transformers model this shape builds (engine/models.py)."""
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size + 2 * d  # attn, MLP, 2 norms
        if self.family == "qwen2":
            per_layer += q + 2 * kv  # q/k/v biases
        if self.family == "gemma3":
            per_layer += 2 * d + 2 * self.head_dim  # pre/post-feedforward norms, q/k norms
        embeddings = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embeddings + d  # + final norm

    @property
    def local_layers(self) -> tuple[bool, ...]:
        """Per layer: does a sliding window apply there (all layers unless interleaved)."""
        every = self.global_every
        return tuple(every is None or (i + 1) % every != 0 for i in range(self.num_layers))

    @classmethod
    def from_file(cls, path: Path) -> ModelShape:
        """A JSON or YAML file holding `family` plus the shape fields."""
        try:
            text = path.read_text()
            data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError("model", f"cannot read shape file {path}: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError("model", f"shape file {path} must hold a mapping of shape fields")
        return cls(**data)


def window_column(value: float | None) -> int | None:
    """The dataset's window column (0, NaN-free, for no window) as a window: the one place that
    reads its spelling of "no window"; hot loops over a table's groups call it without building a
    config."""
    return int(value) or None if value is not None else None


class AttentionConfig(Contract):
    """How the prompt attends: full causal, or a sliding window kept in a KV layout, plus sinks and
    global tokens (selective SWA: chosen tokens every later query sees besides the window)."""

    window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT, description="sliding window; null: full attention")
    layout: Layout = Field(
        default="shift", description="how the window's keys are kept: shift (the oldest dropped), ring (a ring buffer)"
    )
    sinks: int = Field(default=0, ge=0, le=4096, description="first tokens every query sees besides the window")
    global_tokens: int = Field(
        default=0, ge=0, le=MAX_GLOBAL_TOKENS, description="tokens every later query sees besides the window"
    )

    @model_validator(mode="after")
    def _window_needed(self) -> AttentionConfig:
        if self.window is None and self.sinks:
            raise ConfigError("sinks", "needs a window (sinks are kept besides a sliding window)")
        if self.window is None and self.global_tokens:
            raise ConfigError("global_tokens", "needs a window (global tokens are kept besides a sliding window)")
        if self.window is None and self.layout == "ring":
            raise ConfigError("layout", "ring needs a window (the ring holds the window's tokens)")
        return self

    def check_chunk(self, chunk_size: int) -> None:
        """The ExecuTorch rule: a chunk must fit the ring, so chunk <= window."""
        if self.layout == "ring" and self.window is not None and chunk_size > self.window:
            raise ConfigError("chunk_size", f"ring layout needs chunk_size <= window ({self.window}); got {chunk_size}")

    def check_schedule(self, schedule: Sequence[int], context_length: int) -> None:
        """Chunk sizes in order: each >= 1 and fitting the layout, together the whole prompt."""
        if not schedule or min(schedule) < 1:
            raise ConfigError("chunk_size", f"a schedule's sizes must be >= 1; got {list(schedule)[:8]}")
        self.check_chunk(max(schedule))
        if sum(schedule) != context_length:
            raise ConfigError(
                "chunk_size", f"a schedule must sum to the prompt's {context_length} tokens; got {sum(schedule)}"
            )

    @classmethod
    def from_columns(cls, window: int | None, layout: str, sinks: int = 0, global_tokens: int = 0) -> AttentionConfig:
        """The dataset's and the spec's columns (no window: window 0 or None, layout `none`) as a config:
        the one place that reads their spelling of "no window"."""
        return cls(window_column(window), "shift" if layout == NO_WINDOW else layout, sinks, global_tokens)

    @property
    def row_layout(self) -> str:
        """The dataset's layout column: `none` without a window (read back by `from_columns`)."""
        return NO_WINDOW if self.window is None else self.layout

    @property
    def label(self) -> str:
        """For tables: `no window`, or the window, its layout, sinks and global tokens (`w1024 ring s4`)."""
        if self.window is None:
            return "no window"
        extra = (f" s{self.sinks}" if self.sinks else "") + (f" g{self.global_tokens}" if self.global_tokens else "")
        return f"w{self.window} {self.layout}{extra}"


class Hardware(Contract):
    """A machine already profiled (hardware_id), or its descriptors (both, as the engine sends)."""

    hardware_id: str | None = Field(
        default=None, pattern=IDENTIFIER, description="letters, digits, '.', '_', '-' (1-64, a letter or digit first)"
    )
    matmul_gflops: float | None = Field(default=None, ge=0.01, le=1e7, description="measured matmul GFLOP/s")
    bandwidth_gbs: float | None = Field(default=None, ge=0.01, le=1e5, description="measured memory bandwidth, GB/s")
    call_overhead_ms: float | None = Field(
        default=None, ge=1e-4, le=1e4, description="measured fixed cost of one forward call, ms"
    )
    cores: int | None = Field(default=None, ge=1, le=1 << 16, description="physical cores")
    l2_cache_bytes: int = Field(default=0, ge=0, le=1 << 40, description="the L2 cache cpu0 sees, bytes (0: unknown)")
    l3_cache_bytes: int = Field(default=0, ge=0, le=1 << 40, description="the L3 cache cpu0 sees, bytes (0: unknown)")

    @property
    def described(self) -> bool:
        return None not in (self.matmul_gflops, self.bandwidth_gbs, self.call_overhead_ms, self.cores)

    @model_validator(mode="after")
    def _id_or_descriptors(self) -> Hardware:
        if self.hardware_id is None and not self.described:
            raise ConfigError("hardware_id", "give it, or matmul_gflops, bandwidth_gbs, call_overhead_ms and cores")
        return self


DESCRIPTORS = tuple(name for name in Hardware.model_fields if name != "hardware_id")
# those a machine measures per dtype and thread count (the profiler and the engine cache them so); the rest are static
MEASURED = ("matmul_gflops", "bandwidth_gbs", "call_overhead_ms")


def descriptor_key(dtype: str, threads: int) -> str:
    """The key of a machine's descriptors measured for (dtype, threads): its cache and its model's
    hardware table both file them so."""
    return f"{dtype}/{threads}"


def descriptor_of(key: str) -> tuple[str, int]:
    dtype, threads = key.split("/")
    return dtype, int(threads)


class ChunkRequest(Contract):
    """The one question about a prefill, from the engine's policies to the service's features: the
    prompt's length, the model, its attention, how it runs, on which machine, optionally within a
    memory budget and among given sizes."""

    context_length: int = Field(ge=1, le=MAX_CONTEXT, description="the prompt's tokens")
    model: Annotated[str, Field(min_length=1, max_length=64)] | ModelShape = Field(
        description="a preset name or the model's shape fields"
    )
    attention: AttentionConfig = Field(
        default=AttentionConfig(), description="full causal, or a sliding window with its layout, sinks, global tokens"
    )
    dtype: Dtype = Field(default="float32", description="the weights' and activations' type: " + ", ".join(DTYPES))
    threads: int = Field(default=1, ge=1, le=1024, description="threads the prefill runs on")
    attn_impl: AttnImpl = Field(
        default="split",
        description="the attention kernel: " + ", ".join(ATTN_IMPLS) + " (split only in the chunkpilot backend; "
        "masked is the default of the others)",
    )
    backend: Backend = Field(default="chunkpilot", description="what runs the prefill: " + ", ".join(BACKENDS))
    quant: Quant | None = Field(
        default=None,
        description="llama.cpp's GGUF weights: " + ", ".join(QUANTS) + " (f32 if not given); none elsewhere",
    )
    memory_budget_mb: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MEMORY_MB,
        description="the most memory the prefill may add above the loaded model, MB (2**20 bytes): the fastest "
        "predicted size whose predicted peak, with the model's safety margin, fits is chosen; none fits: refused",
    )

    hardware: Hardware = Field(
        description="the machine: a profiled hardware_id, or its measured descriptors (the engine names its own "
        "machine by id; `auto` sends the descriptors)"
    )
    candidates: list[Annotated[int, Field(ge=1, le=MAX_CONTEXT)] | Literal["full"]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CANDIDATES,
        description='chunk sizes to choose from; "full": the whole prompt in one chunk',
    )
    schedule: bool = Field(default=False, description="also answer a chunk schedule (needs a per-chunk cost model)")

    @model_validator(mode="before")
    @classmethod
    def _backend_s_kernel(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("backend", "chunkpilot") == "chunkpilot":
            return data
        data = {"attn_impl": default_attn_impl(data["backend"]), **data}
        if data["backend"] == "llama.cpp" and data.get("quant") is None:  # older rows and clients: f32 GGUF
            data["quant"] = "f32"
        return data

    @model_validator(mode="after")
    def _known_preset(self) -> ChunkRequest:
        check_attn_impl(self.attn_impl, self.backend)
        check_quant(self.quant, self.backend)
        if isinstance(self.model, str) and self.model not in PRESETS:
            raise ConfigError("model", f"must be a preset ({', '.join(PRESETS)}) or shape fields; got {self.model!r}")
        return self

    @property
    def shape(self) -> ModelShape:
        return PRESETS[self.model] if isinstance(self.model, str) else self.model

    @property
    def max_chunk(self) -> int:
        return max_chunk(self.context_length, self.attention.window, self.attention.layout)

    def clamp(self, chunk: int) -> int:
        return clamp_chunk(chunk, self.context_length, self.attention.window, self.attention.layout)

    def kind(self) -> str:
        """Everything a decision depends on but the context length, as a key: requests of one kind
        differ only in length (the service's decision table, exploring, the engine's answer cache)."""
        return self.model_dump_json(exclude={"context_length"})

    def row(self, hardware: Mapping[str, Any]) -> dict[str, Any]:
        """The dataset's config columns (the feature builder's input, less the chunk size): the profiler
        writes them, the service builds them per request; `hardware` holds the DESCRIPTORS."""
        shape, att = self.shape, self.attention
        return {
            "context_length": self.context_length,
            "window": att.window or 0,
            "layout": att.row_layout,
            "sinks": att.sinks,
            "global_tokens": att.global_tokens,
            "global_every": shape.global_every or 0,
            **shape.model_dump(include=set(SHAPE_COLUMNS)),
            "parameters": shape.parameters,
            "tie_embeddings": shape.tie_embeddings,
            "dtype": self.dtype,
            "threads": self.threads,
            "attn_impl": self.attn_impl,
            "backend": self.backend,
            "quant": self.quant,
            **{name: hardware.get(name) or 0 for name in DESCRIPTORS},
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ChunkRequest:
        """A dataset row as the request that asks about its config (the inverse of `row`)."""
        shape = ModelShape(
            family=row["family"],
            **{name: row[name] for name in SHAPE_COLUMNS},
            global_every=row["global_every"] or None,
            tie_embeddings=row.get("tie_embeddings"),
        )
        return cls(
            context_length=row["context_length"],
            model=shape,
            attention=AttentionConfig.from_columns(
                int(row["window"]), row["layout"], row["sinks"], row.get("global_tokens") or 0
            ),
            dtype=row["dtype"],
            threads=row["threads"],
            attn_impl=row["attn_impl"],
            backend=row.get("backend") or "chunkpilot",
            quant=quant if isinstance(quant := row.get("quant"), str) else None,  # null (NaN) in older rows: f32
            hardware=Hardware(hardware_id=row.get("hardware_id"), **{name: row[name] for name in DESCRIPTORS}),
        )


# who answered: the service's recipe now (model), its decision table (table) or its anchor while the
# table builds (anchor); the engine's client: the service, its cache, the model loaded in-process, or
# the anchor as a fallback; else a policy of the engine's own
Reached = Literal["service", "cache", "in-process", "fallback"]  # how `auto`'s decision reached the engine
Source = Literal["model", "table", "anchor", "fixed", "full", "rule", "schedule"] | Reached


class Outcome(Contract):
    """One prefill the engine ran under `auto`, as it reports it (telemetry): the request, the
    chosen chunk and where the choice came from, and what it measured."""

    request: ChunkRequest
    chunk_size: int = Field(ge=1, le=MAX_CONTEXT)
    source: Reached
    model_version: str | None = Field(default=None, max_length=32)
    explored: bool = False  # the service answered a candidate other than its argmin
    tokenize_ms: float = Field(ge=0, le=MAX_MS)
    prefill_ms: float = Field(gt=0, le=MAX_MS)
    # 0 where the first token comes from the prefill itself (stock generate with max_new_tokens=1)
    first_decode_ms: float = Field(ge=0, le=MAX_MS)
    ttft_ms: float = Field(gt=0, le=MAX_MS)
    chunk_ms: list[Annotated[float, Field(gt=0, le=MAX_MS)]] = Field(min_length=1, max_length=MAX_CONTEXT)
    finished_at: datetime

    @model_validator(mode="after")
    def _consistent(self) -> Outcome:
        n, c = self.request.context_length, self.chunk_size
        if c > self.request.max_chunk:
            raise ConfigError("chunk_size", f"must be <= {self.request.max_chunk} for this request; got {c}")
        if not self.request.hardware.described:
            raise ConfigError("hardware", "needs the machine's descriptors (its id alone may be unknown)")
        if len(self.chunk_ms) != chunk_count(n, c):
            raise ConfigError("chunk_ms", f"needs {chunk_count(n, c)} chunk times for {n} tokens in chunks of {c}")
        if sum(self.chunk_ms) > self.prefill_ms * 1.05 + 1:  # the chunks run inside the prefill
            raise ConfigError(
                "chunk_ms", f"sum to {sum(self.chunk_ms):.1f} ms, more than the prefill's {self.prefill_ms:.1f}"
            )
        parts = self.tokenize_ms + self.prefill_ms + self.first_decode_ms
        if not parts <= self.ttft_ms * 1.05 + 1 or self.ttft_ms > 2 * parts + 100:  # + the decision's time
            raise ConfigError("ttft_ms", f"{self.ttft_ms:.1f} ms contradicts its parts ({parts:.1f} ms)")
        return self


# the shape fields a dataset row keeps as columns (the model's own window and positions do not
# change the cost of a request; its attention set-up is the request's)
SHAPE_COLUMNS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)


class Candidate(BaseModel):
    chunk_size: int = Field(description="a chunk size, tokens (the prompt's length: one shot)")
    predicted_ttft_ms: float = Field(description="the TTFT the model predicts with it, ms")
    predicted_peak_mb: float | None = Field(
        default=None,
        description="the memory the model predicts the prefill adds at its peak above the loaded model, MB "
        "(null: the model has no memory side)",
    )


class Anchor(Candidate):
    """The strongest simple baseline of the request's machine, backend and kernel (judge.lineup):
    what do-no-harm keeps when the model is unsure, and what `auto` falls back to."""

    name: str = Field(description="the baseline, e.g. 'best single size (2048)', 'one shot', 'simple rule'")
    spec: str = Field(description="the baseline as `--chunk-size` takes it: a size, 'full', 'rule' or 'simple-rule'")


class Decision(BaseModel):
    """One chunk decision, one type from the recipe to the engine: the service sends it, the
    engine's policies return it (the engine's client relabels its `source` with the way it came).
    A chunk_size equal to the prompt's length is the whole prompt (one shot)."""

    model_config = ConfigDict(frozen=True)

    chunk_size: int = Field(description="the chunk size to prefill with, tokens (the prompt's length: one shot)")
    source: Source = Field(description="who decided, and how it reached the engine")
    schedule: tuple[int, ...] | None = Field(
        default=None, description="when asked: chunk sizes in order, by the per-chunk cost model"
    )
    predicted_ttft_ms: float | None = Field(
        default=None, description="the TTFT the model predicts with that size, ms (null: no model decided)"
    )
    model_version: str | None = Field(default=None, description="the registered model version that answered")
    explored: bool = Field(
        default=False,
        description="a candidate other than the model's pick, measured to learn from (bounded: see /metrics)",
    )
    deferred: bool = Field(
        default=False,
        description="the anchor's size was kept: do-no-harm found the predicted saving within the members' spread, "
        "or the model does not know this kind of request (a model shape, machine, backend or kernel it never saw)",
    )
    span: tuple[int, int] | None = Field(
        default=None,
        description="the lengths [first, last] of this kind of request the answer holds for (a chunk_size "
        "equal to the length: each one's whole prompt); null: for this length only",
    )
    reason: str | None = Field(
        default=None, description="why a fallback fell back, or why the anchor decided a kind the model does not know"
    )
    top: list[Candidate] = Field(
        default_factory=list, description="the fastest candidates by the model's prediction, fastest first"
    )
    rule: Candidate | None = Field(
        default=None, description="the hand rule's size and the TTFT the model predicts with it"
    )
    anchor: Anchor | None = Field(
        default=None, description="the strongest simple baseline here, its size and the TTFT predicted with it"
    )
    candidates: list[Candidate] = Field(
        default_factory=list,
        description="every feasible candidate, smallest first, with its predicted TTFT and peak memory",
    )
    memory_margin: float | None = Field(
        default=None,
        description="the safety margin a predicted peak is raised by before it is held against memory_budget_mb "
        "(the 99th percentile of held-out configs' rise above their prediction); null: no memory side",
    )
    # what only the service reads, never sent: each other candidate's expected gain (estimator.decide.Gain)
    _gains: tuple = PrivateAttr(default=())


PRESETS: dict[str, ModelShape] = {
    # Llama-style, full attention, MHA.
    "llama-tiny": ModelShape("llama", 4, 256, 4, 4, 768, 4096),
    # Mistral-style with its own sliding window, GQA 2:1 (the 44M model of the project's notes).
    "mistral-44m": ModelShape("mistral", 12, 512, 8, 4, 1536, 6144, window=1024),
    # Qwen2-style, aggressive GQA (8:1), small heads.
    "qwen2-gqa": ModelShape("qwen2", 8, 512, 16, 2, 1408, 8192, head_dim=32),
    # Gemma-3-style: 5 local (windowed) layers per global layer.
    "gemma3-interleaved": ModelShape("gemma3", 12, 512, 8, 4, 1536, 8192, head_dim=64, window=512, global_every=6),
    # Llama-style at ~110M parameters, for realism.
    "llama-110m": ModelShape("llama", 12, 768, 12, 12, 2048, 16384),
}
