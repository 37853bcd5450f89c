"""A transformers model's weights as a GGUF file that llama.cpp loads: the project writes its own
checkpoints (random weights from a preset or a shape file; nothing downloaded), in f32 or Q8_0.

What llama.cpp must be told that transformers keeps implicit: the architecture's hyperparameters,
Llama's rotary layout (llama.cpp rotates adjacent pairs where transformers rotates halves, so Q and
K rows are permuted, as llama.cpp's own convert_hf_to_gguf.py does) and a vocabulary. The
vocabulary is a placeholder of the model's size: ChunkPilot hands llama.cpp token ids, never text."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from transformers import PreTrainedModel

from chunkpilot.contract import ConfigError, ModelShape

Quant = Literal["f32", "q8_0"]
QUANTS: tuple[str, ...] = Quant.__args__
# family -> llama.cpp architecture; Mistral without its window is Llama to llama.cpp
ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
PERMUTED = {"llama"}  # the architectures whose rotary embedding pairs adjacent dimensions
_SPECIAL = ("<unk>", "<s>", "</s>")


def supported(shape: ModelShape) -> str | None:
    """Why llama.cpp cannot run this shape as the transformers model does, or None."""
    if shape.family not in ARCHS:
        return f"family {shape.family} has no GGUF export here (only {', '.join(ARCHS)})"
    if shape.window is not None:
        return f"a sliding window ({shape.window}): llama.cpp's {ARCHS[shape.family]} architecture attends fully"
    return None


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """[heads * head_dim, d] rows from transformers' half-split rotary order to llama.cpp's pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocabulary(size: int) -> tuple[list[str], list[int]]:
    """(tokens, token types): the specials, the 256 byte tokens a SentencePiece vocabulary needs,
    then placeholders up to `size`."""
    import gguf

    tokens = [*_SPECIAL, *(f"<0x{b:02X}>" for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, *[gguf.TokenType.BYTE] * 256]
    if size < len(tokens):
        raise ConfigError("vocab_size", f"must be >= {len(tokens)} for a GGUF vocabulary; got {size}")
    tokens += [f"\u2581t{i}" for i in range(size - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (size - len(types))
    return tokens, [int(t) for t in types]


def write_gguf(model: PreTrainedModel, shape: ModelShape, path: Path, quant: Quant = "f32") -> Path:
    """`model`'s weights at `path` (written whole, then renamed into place)."""
    import gguf

    if (why := supported(shape)) is not None:
        raise ConfigError("model", f"cannot export to GGUF: {why}")
    if quant not in QUANTS:
        raise ConfigError("quant", f"must be one of {', '.join(QUANTS)}; got {quant!r}")
    arch, config = ARCHS[shape.family], model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], shape.num_layers)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") or getattr(config, "rope_theta", 10000.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.max_position)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if quant == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types = _vocabulary(shape.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and shape.tie_embeddings:
            continue  # llama.cpp reuses the embedding when the file has no output matrix
        w = tensor.detach().float().cpu().numpy()
        if arch in PERMUTED and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _permute(w, shape.num_heads if "q_proj" in name else shape.num_kv_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ConfigError("model", f"no GGUF name for tensor {name} of a {shape.family} model")
        if quant == "q8_0" and w.ndim == 2 and w.shape[1] % 32 == 0:  # norms and biases stay f32
            writer.add_tensor(
                gguf_name,
                gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
