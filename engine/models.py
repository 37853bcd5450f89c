"""Real transformers causal LMs: presets and shape files (seeded random weights) or local checkpoints."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)
from transformers.utils import logging as hf_logging

from chunkpilot.contract import PRESETS, ConfigError, ModelShape

from .attention import ATTN_NAME

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gemma3_text": "gemma3"}
# ModelShape field -> the transformers config attribute it maps to, in both directions
_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "max_position": "max_position_embeddings",
}


@dataclass
class LoadedModel:
    name: str  # preset name, checkpoint folder or shape file, as given
    shape: ModelShape
    model: PreTrainedModel
    checkpoint: Path | None  # where a tokenizer may live


def hf_config(shape: ModelShape) -> PretrainedConfig:
    """The transformers config of a shape: one place maps our fields onto each family's names."""
    common = {theirs: getattr(shape, ours) for ours, theirs in _FIELDS.items()}
    common["tie_word_embeddings"] = shape.tie_embeddings
    if shape.family == "llama":
        return LlamaConfig(**common)
    if shape.family == "mistral":
        return MistralConfig(**common, sliding_window=shape.window)
    if shape.family == "qwen2":
        windowed = shape.window is not None
        return Qwen2Config(**common, use_sliding_window=windowed, sliding_window=shape.window, max_window_layers=0)
    layer_types = ["sliding_attention" if local else "full_attention" for local in shape.local_layers]
    return Gemma3TextConfig(
        **common,
        sliding_window=shape.window or shape.max_position,
        layer_types=layer_types,
        query_pre_attn_scalar=shape.head_dim,
    )


def shape_of(config: PretrainedConfig) -> ModelShape:
    """Read a checkpoint's config back into a ModelShape (the inverse of `hf_config`)."""
    family = _MODEL_TYPES.get(config.model_type)
    if family is None:
        raise ConfigError(
            "model", f"model_type {config.model_type!r} is not supported; supported: {', '.join(_MODEL_TYPES)}"
        )
    window = getattr(config, "sliding_window", None)
    global_every = None
    if family == "qwen2" and not config.use_sliding_window:
        window = None
    if family == "gemma3":
        full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
        global_every = full[0] + 1 if full else None
        if full and full != list(range(full[0], config.num_hidden_layers, full[0] + 1)):
            raise ConfigError(
                "model", f"gemma3 layer_types must repeat one local/global pattern; got {config.layer_types}"
            )
        if window is not None and window >= config.max_position_embeddings:
            window = None  # `hf_config` writes max_position for "no window"
    fields = {ours: getattr(config, theirs, None) for ours, theirs in _FIELDS.items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return ModelShape(family=family, window=window, global_every=global_every, tie_embeddings=tied, **fields)


def build_model(shape: ModelShape, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """Random weights, the same for the same shape, seed and device, without touching the global RNG.
    On CPU they are drawn in float32 and cast (the same weights in every dtype); on a GPU drawn in
    place in the dtype, since a 7B model's float32 copy on the host would cost minutes and 28 GB."""
    config = hf_config(shape)
    devices = [] if device == "cpu" else [torch.device(device)]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if device == "cpu":
            return AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_NAME, dtype=torch.float32)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_NAME, dtype=DTYPES[dtype])


def load_checkpoint(path: Path) -> PreTrainedModel:
    if not (path / "config.json").is_file():
        raise ConfigError("model", f"checkpoint folder {path} has no config.json")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a broken folder should give our one line, not transformers' report
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(path)
            shape_of(config)  # refuse unsupported families before reading weights
            return AutoModelForCausalLM.from_pretrained(path, attn_implementation=ATTN_NAME, dtype=torch.float32)
    except ConfigError:
        raise
    except Exception as exc:  # transformers raises many types for a broken folder
        raise ConfigError("model", f"cannot load checkpoint {path}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def load_model(spec: str, dtype: str = "float32", seed: int = 0, device: str = "cpu") -> LoadedModel:
    """`spec` is a preset name, a checkpoint folder or a JSON/YAML shape file."""
    if dtype not in DTYPES:
        raise ConfigError("dtype", f"must be one of {', '.join(DTYPES)}; got {dtype!r}")
    path = Path(spec)
    if spec in PRESETS:
        shape, checkpoint = PRESETS[spec], None
        model = build_model(shape, seed, dtype, device)
    elif path.is_dir():
        model, checkpoint = load_checkpoint(path), path
        shape = shape_of(model.config)
    elif path.is_file():
        shape, checkpoint = ModelShape.from_file(path), None
        model = build_model(shape, seed, dtype, device)
    else:
        raise ConfigError(
            "model", f"{spec!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint folder nor a shape file"
        )
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    model.requires_grad_(False)
    return LoadedModel(spec, shape, model, checkpoint)
