"""The llama.cpp library a process loads, chosen before its first `import llama_cpp`: the package's
own (built for any x86-64 CPU with AVX2 by tools/build_llama.sh), or a faster variant of its CPU
kernels beside it (llama_cpp/lib-<name>/, AVX-512 today) where this CPU has every flag the
variant's `requires` file lists. llama-cpp-python loads its library from $LLAMA_CPP_LIB_PATH when
set: that is how the choice is made, and since the variable is inherited, a probe's child process
(engine/llama_probe.py) loads what its caller will. A user's own $LLAMA_CPP_LIB_PATH is kept."""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType

from chunkpilot.contract import ConfigError

LIB_PATH = "LLAMA_CPP_LIB_PATH"  # llama-cpp-python's own override of its library's folder


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux names them (/proc/cpuinfo); empty where it cannot say."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    return frozenset(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


def variant() -> Path | None:
    """The variant folder this CPU runs that asks the most of it, or None (the package's own)."""
    spec = find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(spec.submodule_search_locations[0])
    runnable = [
        (len(needs), folder)
        for folder in sorted(package.glob("lib-*"))
        if (folder / "requires").is_file() and (needs := set((folder / "requires").read_text().split())) <= cpu_flags()
    ]
    return max(runnable)[1] if runnable else None


def choose_library() -> None:
    """$LLAMA_CPP_LIB_PATH set to the variant this CPU runs, unless it is set already."""
    if LIB_PATH not in os.environ and (folder := variant()) is not None:
        os.environ[LIB_PATH] = str(folder)


def library() -> str:
    """The library folder a process loads: $LLAMA_CPP_LIB_PATH, else the package's own `lib`."""
    return os.environ.get(LIB_PATH, "lib")


def llama_cpp() -> ModuleType:
    """The `llama_cpp` module, its library the fastest this CPU runs (unless $LLAMA_CPP_LIB_PATH
    says which); ConfigError naming the backend when it is not installed."""
    choose_library()
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(
            "backend", "llama.cpp needs llama-cpp-python: pip install 'chunkpilot[llama]' (a source build)"
        ) from None
    return llama_cpp


def build() -> str:
    """What the rows record of the loaded llama.cpp: the package's version and its library folder."""
    return f"{llama_cpp().__version__} {Path(library()).name}"


# the buffers a llama.cpp context allocates beside the model's weights, as it logs them
_BUFFER = re.compile(r"(KV|compute|output) buffer size =\s*([0-9.]+) MiB")


@contextmanager
def buffers_reported() -> Iterator[list[int]]:
    """llama.cpp's log heard for the duration (its own printer restored after): the list yielded
    fills with the bytes of each KV, compute and output buffer a context created inside reports."""
    lib, heard = llama_cpp(), []
    sizes: list[int] = []

    @lib.llama_log_callback
    def hear(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        heard.append(text.decode(errors="replace"))

    lib.llama_log_set(hear, ctypes.c_void_p(0))
    try:
        yield sizes
    finally:
        lib.llama_log_set(lib._logger.llama_log_callback, ctypes.c_void_p(0))
        sizes += [round(float(m.group(2)) * 2**20) for m in _BUFFER.finditer("".join(heard))]
