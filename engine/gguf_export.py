"""A model's weights as a GGUF file that llama.cpp loads: the project writes its own checkpoints
(random weights from a preset or a shape file; nothing downloaded), in f32, then quantised by
llama.cpp's own quantizer (`llama_model_quantize`, in the installed package) as people quantise
theirs: f16, q8_0, q4_k_m (its mix of Q4_K and Q6_K, and its fallbacks where a row's width is not a
multiple of 256).

What llama.cpp must be told that transformers keeps implicit: the architecture's hyperparameters,
Llama's rotary layout (llama.cpp rotates adjacent pairs where transformers rotates halves, so Q and
K rows are permuted, as llama.cpp's own convert_hf_to_gguf.py does), Gemma 3's window, its pattern
of local and global layers and the local layers' rotary base, its norms' 1 + w, and a vocabulary. The
vocabulary is a placeholder of the model's size: ChunkPilot hands llama.cpp token ids, never text.

Light: numpy and gguf only (no torch), so that a probe's child process writes a tiny model fast."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkpilot.contract import QUANTS, ConfigError, ModelShape, Quant

from .isolation import run_in_child
from .llama_lib import llama_cpp

# llama.cpp's llama_ftype of each (LLAMA_FTYPE_*), the value GGUF files carry in general.file_type
FTYPES: dict[Quant, int] = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_k_m": 15}
QUANT_OF = {ftype: quant for quant, ftype in FTYPES.items()}
# family -> llama.cpp architecture; Mistral without its window is Llama to llama.cpp
ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "gemma3": "gemma3"}
PERMUTED = {"llama"}  # the architectures whose rotary embedding pairs adjacent dimensions
INTERLEAVED = {"gemma3"}  # the architectures whose local layers slide a window in llama.cpp too
_SPECIAL = ("<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class Weights:
    """What a GGUF file is written from: transformers' tensor names and values (float32), and the
    two hyperparameters a ModelShape does not hold."""

    tensors: Mapping[str, np.ndarray]
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    rope_theta_local: float | None = None  # the sliding-window layers' own base (Gemma 3: 10,000)


def supported(shape: ModelShape) -> str | None:
    """Why llama.cpp cannot run this shape as the transformers model does, or None."""
    if shape.family not in ARCHS:
        return f"family {shape.family} has no GGUF export here (only {', '.join(ARCHS)})"
    if shape.window is not None and shape.family not in INTERLEAVED:
        return f"a sliding window ({shape.window}): llama.cpp's {ARCHS[shape.family]} architecture attends fully"
    return None


def random_weights(shape: ModelShape, seed: int = 0) -> Weights:
    """Seeded random weights of a Llama-style `shape` under transformers' names (numpy only)."""
    rng = np.random.default_rng(seed)
    d, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": matrix(shape.vocab_size, d), "model.norm.weight": np.ones(d, np.float32)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}"
        tensors |= {
            f"{p}.input_layernorm.weight": np.ones(d, np.float32),
            f"{p}.post_attention_layernorm.weight": np.ones(d, np.float32),
            f"{p}.self_attn.q_proj.weight": matrix(q, d),
            f"{p}.self_attn.k_proj.weight": matrix(kv, d),
            f"{p}.self_attn.v_proj.weight": matrix(kv, d),
            f"{p}.self_attn.o_proj.weight": matrix(d, q),
            f"{p}.mlp.gate_proj.weight": matrix(shape.intermediate_size, d),
            f"{p}.mlp.up_proj.weight": matrix(shape.intermediate_size, d),
            f"{p}.mlp.down_proj.weight": matrix(d, shape.intermediate_size),
        }
        if shape.family == "gemma3":  # norms around both blocks and on q and k (stored as w, applied as 1 + w)
            tensors |= {
                f"{p}.pre_feedforward_layernorm.weight": np.zeros(d, np.float32),
                f"{p}.post_feedforward_layernorm.weight": np.zeros(d, np.float32),
                f"{p}.self_attn.q_norm.weight": np.zeros(shape.head_dim, np.float32),
                f"{p}.self_attn.k_norm.weight": np.zeros(shape.head_dim, np.float32),
            }
            for name in ("input_layernorm", "post_attention_layernorm"):
                tensors[f"{p}.{name}.weight"] = np.zeros(d, np.float32)
        if shape.family == "qwen2":  # its q/k/v projections carry biases
            tensors |= {
                f"{p}.self_attn.{n}_proj.bias": np.zeros(w, np.float32) for n, w in (("q", q), ("k", kv), ("v", kv))
            }
    if shape.family == "gemma3":
        tensors["model.norm.weight"] = np.zeros(d, np.float32)
    if not shape.tie_embeddings:
        tensors["lm_head.weight"] = matrix(shape.vocab_size, d)
    return Weights(tensors, rope_theta_local=10000.0 if shape.family in INTERLEAVED else None)


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


def _write_f32(weights: Weights, shape: ModelShape, path: Path) -> None:
    import gguf

    arch = ARCHS[shape.family]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], shape.num_layers)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.max_position)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(float(weights.rope_theta))
    writer.add_layer_norm_rms_eps(float(weights.rms_norm_eps))
    if shape.family in INTERLEAVED and shape.window is not None:
        writer.add_sliding_window(shape.window)
        writer.add_sliding_window_pattern([bool(local) for local in shape.local_layers])
        writer.add_rope_freq_base_swa(float(weights.rope_theta_local or weights.rope_theta))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, types = _vocabulary(shape.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, w in weights.tensors.items():
        if name == "lm_head.weight" and shape.tie_embeddings:
            continue  # llama.cpp reuses the embedding when the file has no output matrix
        if arch in PERMUTED and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _permute(w, shape.num_heads if "q_proj" in name else shape.num_kv_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + 1.0  # Gemma's RMSNorm scales by 1 + w; llama.cpp's by w (as convert_hf_to_gguf.py writes it)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ConfigError("model", f"no GGUF name for tensor {name} of a {shape.family} model")
        writer.add_tensor(gguf_name, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(source: str, target: str, ftype: int, threads: int = 0) -> None:
    """llama.cpp's quantizer, `source` (an f32 GGUF) to `target` at `ftype`; native code: call it
    through `run_in_child`, as write_gguf does."""
    import ctypes

    lib = llama_cpp()
    lib._logger.set_verbose(False)  # its per-tensor log lines are not ours to print
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, threads
    if (code := lib.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))) != 0:
        raise RuntimeError(f"llama_model_quantize returned {code} for {source} -> ftype {ftype}")


def write_gguf(weights: Weights, shape: ModelShape, path: Path, quant: Quant = "f32") -> Path:
    """`weights` at `path` in `quant` (written whole, then renamed into place)."""
    if (why := supported(shape)) is not None:
        raise ConfigError("model", f"cannot export to GGUF: {why}")
    if quant not in FTYPES:
        raise ConfigError("quant", f"must be one of {', '.join(QUANTS)}; got {quant!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    f32 = path.with_name(f".tmp-f32-{path.name}")
    _write_f32(weights, shape, f32)
    if quant == "f32":
        f32.replace(path)
        return path
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        run_in_child(quantize, str(f32), str(tmp), FTYPES[quant], what=f"quantising {path.name} to {quant}")
    finally:
        f32.unlink(missing_ok=True)
    tmp.replace(path)
    return path
