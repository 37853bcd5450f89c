"""Shared, light types: model shape, attention config, the hand rule.

Engine, training and predictor all read these, so this module imports neither torch nor
transformers (the prediction service must stay small).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import yaml

FAMILIES = ("llama", "mistral", "qwen2", "gemma3")
LAYOUTS = ("shift", "ring")
DTYPES = ("float32", "bfloat16")
ATTN_IMPLS = ("sdpa", "eager")
Layout = Literal["shift", "ring"]
# chunk sizes profiled and predicted for by default ("full" = the whole prompt in one chunk)
DEFAULT_CHUNKS: tuple[int | str, ...] = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, "full")


class ConfigError(ValueError):
    """Bad user input: names the field and what is allowed (the CLI prints it as one line)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def check_int(field: str, value: Any, low: int, high: int | None = None) -> int:
    """`value` (an int or a string of digits) as an int in [low, high], else a ConfigError."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number: int | None = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        number = None
    if number is None or number < low or (high is not None and number > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ConfigError(field, f"must be {allowed}, got {value!r}")
    return number


def check_float(field: str, value: Any, low: float, high: float) -> float:
    """`value` as a number in (low, high], else a ConfigError naming the field and the range."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not low < number <= high:  # NaN fails too
        raise ConfigError(field, f"must be a number in ({low:g}, {high:g}]; got {value!r}")
    return number


def check_choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(field, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


@dataclass(frozen=True)
class ModelShape:
    """Everything about a decoder-only model that decides its prefill cost."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int | None = None  # None: hidden_size // num_heads (set on creation)
    max_position: int = 32768
    window: int | None = None  # the model's own sliding window (default for the engine)
    global_every: int | None = None  # interleaved: every k-th layer is global, the rest local

    def __post_init__(self) -> None:
        check_choice("family", self.family, FAMILIES)
        lows = dict(num_layers=1, hidden_size=1, num_heads=1, num_kv_heads=1, intermediate_size=1, vocab_size=2,
                    max_position=2, head_dim=1, window=1)
        for name, low in lows.items():
            if getattr(self, name) is not None:  # normalise "8" from a shape file to 8
                object.__setattr__(self, name, check_int(name, getattr(self, name), low))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError("hidden_size", f"must be a multiple of num_heads ({self.num_heads}) unless head_dim is set")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", f"must divide num_heads ({self.num_heads}); got {self.num_kv_heads}")
        if self.global_every is not None:
            check_int("global_every", self.global_every, 1, self.num_layers)

    @property
    def parameters(self) -> int:
        """Parameter count of the transformers model this shape builds (engine/models.py)."""
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size + 2 * d  # attn, MLP, 2 norms
        if self.family == "qwen2":
            per_layer += q + 2 * kv  # q/k/v biases
        if self.family == "gemma3":
            per_layer += 2 * d + 2 * self.head_dim  # pre/post-feedforward norms, q/k norms
        embeddings = self.vocab_size * d * (1 if self.family == "gemma3" else 2)  # gemma ties the LM head
        return self.num_layers * per_layer + embeddings + d  # + final norm

    @property
    def local_layers(self) -> tuple[bool, ...]:
        """Per layer: does a sliding window apply there (all layers unless interleaved)."""
        every = self.global_every
        return tuple(every is None or (i + 1) % every != 0 for i in range(self.num_layers))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelShape:
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(unknown[0], f"unknown shape field; allowed: {', '.join(known)}")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
        if missing:
            raise ConfigError(missing[0], "is required in a shape file")
        return cls(**data)

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
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AttentionConfig:
    """How the prompt attends: full causal, or a sliding window kept in a KV layout, plus sinks."""

    window: int | None = None
    layout: Layout = "shift"
    sinks: int = 0  # first tokens every query sees besides the window (StreamingLLM)

    def __post_init__(self) -> None:
        if self.window is not None:
            check_int("window", self.window, 1)
        check_choice("kv_layout", self.layout, LAYOUTS)
        check_int("sinks", self.sinks, 0)
        if self.window is None and self.sinks:
            raise ConfigError("sinks", "needs a window (sinks are kept besides a sliding window)")
        if self.window is None and self.layout == "ring":
            raise ConfigError("kv_layout", "ring needs a window (the ring holds the window's tokens)")

    def check_chunk(self, chunk_size: int) -> None:
        """The ExecuTorch rule: a chunk must fit the ring, so chunk <= window."""
        if self.layout == "ring" and self.window is not None and chunk_size > self.window:
            raise ConfigError("chunk_size", f"ring layout needs chunk_size <= window ({self.window}); got {chunk_size}")


def hand_rule(context_length: int) -> int:
    """The write-up's rule: the baseline to beat and the engine's fallback."""
    if context_length <= 512:
        return 512
    if context_length <= 1536:
        return 1024
    return 1024 if context_length % 1024 == 0 else 768


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


@dataclass(frozen=True)
class RequestFeatures:
    """What a chunk-size policy may look at before a prefill."""

    context_length: int
    shape: ModelShape
    attention: AttentionConfig
    dtype: str = "float32"
    threads: int = 1
    attn_impl: str = "sdpa"

    @property
    def max_chunk(self) -> int:
        return max_chunk(self.context_length, self.attention.window, self.attention.layout)


def max_chunk(context_length: int, window: int | None, layout: str) -> int:
    """The largest chunk that is both useful (<= context) and allowed (ring: <= window)."""
    return min(context_length, window) if layout == "ring" and window else context_length


def feasible_chunks(
    sizes: tuple[int | str, ...], context_length: int, window: int | None, layout: str
) -> tuple[list[int], list[str]]:
    """(the sizes a config can run, sorted, `full` being the context; a reason for each other)."""
    chosen: list[int] = []
    skipped: list[str] = []
    for size in sizes:
        chunk = context_length if size == "full" else int(size)
        if chunk > context_length:
            skipped.append(f"{size}: larger than the context ({context_length})")
        elif layout == "ring" and window and chunk > window:
            skipped.append(f"{size}: ring layout needs chunk <= window ({window})")
        elif chunk not in chosen:
            chosen.append(chunk)
    return sorted(chosen), skipped
