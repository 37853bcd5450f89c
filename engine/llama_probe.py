"""Whether this machine's llama.cpp runs a quantisation, asked before the first use in a process:
a child process writes a tiny model of that quantisation, loads it and decodes one batch. A build
whose kernels the CPU refuses (SIGILL) then kills that child, not the caller, and every caller (the
llama.cpp engine, hence `chunkpilot prefill --backend llama.cpp` and the profiler; the helper for a
`llama_cpp.Llama` of the user's) gets a ConfigError naming the quantisation and the CPU features
llama.cpp reported. One probe per process, quantisation and flash-attention setting; the verdict,
either way, is kept."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from chunkpilot.cache import user_cache_dir
from chunkpilot.contract import ConfigError, ModelShape

from .gguf_export import FTYPES, QUANTS, quantize, random_weights, write_gguf
from .isolation import ChildDied, note, run_in_child
from .llama_lib import choose_library, library, llama_cpp

# one layer of K-quant-friendly widths (rows of 256): every quantisation's kernels run on it
TINY = ModelShape(
    family="llama",
    num_layers=1,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=512,
    vocab_size=512,
    max_position=512,
)
BATCH = 64  # tokens decoded at once: a batch, as a prefill decodes, not a single token
PROBE_TIMEOUT_S = 120.0

_verdicts: dict[tuple[int, bool], str | ConfigError] = {}


def quant_name(file_type: int) -> str:
    """The quantisation's name for a GGUF `general.file_type` (llama.cpp's llama_ftype)."""
    return next((q for q, f in FTYPES.items() if f == file_type), f"GGUF file type {file_type}")


def _probe_here(file_type: int, flash_attn: bool, folder: str) -> str:
    """In the child: note llama.cpp's CPU features, then write, load and decode a tiny model of
    `file_type` (quantised by llama.cpp itself, as a user's file is); its features line."""
    lib = llama_cpp()
    features = lib.llama_print_system_info().decode().strip().strip("|").strip()
    note(features)
    path = Path(folder) / f"probe-{lib.__version__}-{file_type}.gguf"
    if not path.exists():
        f32 = write_gguf(random_weights(TINY), TINY, path.with_name(f".f32-{os.getpid()}-{path.name}"))
        if file_type == 0:
            f32.replace(path)
        else:
            quantize(str(f32), str(f32.with_suffix(".q")), file_type)
            f32.with_suffix(".q").replace(path)
            f32.unlink()
    llm = lib.Llama(
        str(path),
        n_ctx=2 * BATCH,
        n_batch=BATCH,
        n_ubatch=BATCH,
        n_threads=min(2, os.cpu_count() or 1),
        flash_attn=flash_attn,
        verbose=False,
    )
    llm.eval(list(range(3, 3 + BATCH)))
    llm.close()
    return features


def verdict(probe: Callable[[int, bool, str], str], file_type: int, flash_attn: bool) -> str:
    """`probe(file_type, flash_attn, folder)` run in a child: llama.cpp's features line, or a
    ConfigError (field `quant`) that says how the child ended and what llama.cpp reported."""
    quant = quant_name(file_type)
    setting = f"{quant}{' with flash attention' if flash_attn else ''}"
    try:
        return run_in_child(
            probe,
            file_type,
            flash_attn,
            str(user_cache_dir() / "gguf"),
            what=f"llama.cpp probe of {setting}",
            timeout_s=PROBE_TIMEOUT_S,
        )
    except ChildDied as exc:
        features = exc.notes[0] if exc.notes else "nothing (it ended before saying)"
        said = f"(llama.cpp reported: {features}; library {library()})"
        if not exc.how.startswith("died of"):  # no crash: the child could not start or run (its stderr says)
            raise ConfigError("quant", f"llama.cpp's probe of {setting} {exc.how} {said}") from None
        raise ConfigError(
            "quant",
            f"llama.cpp cannot run {setting} on this machine: a tiny {quant} model's decode {exc.how} in a "
            f"probe process {said}; this build of llama.cpp crashes on this CPU: reinstall it portably "
            "(`make` builds it without native-only instructions; $LLAMA_CPP_LIB_PATH picks another library: "
            f"docs/backends.md) or choose another of {', '.join(QUANTS)}",
        ) from None
    except ConfigError:  # said in the child, naming its field (llama-cpp-python not installed, say)
        raise
    except Exception as exc:  # it ran and failed (a load refused, say): unavailable, saying why
        raise ConfigError("quant", f"llama.cpp failed a probe of {setting} on this machine: {exc}") from None


def require(file_type: int, flash_attn: bool = False) -> str:
    """llama.cpp's CPU features line once it has run a tiny model of `file_type` (FTYPES) here,
    probed once per process and setting, with the library this process will load (the child
    inherits the choice); otherwise the ConfigError of `verdict`, every time asked."""
    choose_library()
    key = (file_type, flash_attn)
    if key not in _verdicts:
        try:
            _verdicts[key] = verdict(_probe_here, file_type, flash_attn)
        except ConfigError as exc:
            _verdicts[key] = exc
    if isinstance(found := _verdicts[key], ConfigError):
        raise found
    return found
