#!/usr/bin/env bash
# llama.cpp for the `llama` extra, built once per machine kind and installed into the venv of $1:
# the one place that says how (the Makefile's install step runs it).
#
# pip's default build compiles llama.cpp with -march=native: fast where it is built, and on an
# Intel Xeon with AMX a Q8_0 decode of that build died (SIGILL, SIGSEGV) and took its caller down.
# Here the package is built for any x86-64 CPU with AVX2 (every machine of the last decade; on
# other architectures the x86 flags do nothing and the build is the generic one), and beside it a
# variant of its CPU kernels (libggml-cpu) with AVX-512, VNNI and BF16 and no AMX, in
# llama_cpp/lib-avx512/. engine/llama_lib.py picks that variant at run time where the CPU has what
# its `requires` file lists (LLAMA_CPP_LIB_PATH), so a venv copied to an older CPU still runs.
# Measured on the Intel Xeon 5e4830eb8869 (bench/llama_builds.py, docs/backends.md): the native
# build and the AVX-512 variant prefill alike in f32; AVX2 alone is about a third slower.
#
# The wheel and the variant are kept in the user's cache under a key of the pin, the flags and the
# architecture: pip's own wheel cache ignores CMAKE_ARGS and would hand back a native build.
set -euo pipefail
usage="usage: tools/build_llama.sh PYTHON  (installs llama-cpp-python, built as above, into PYTHON's environment)"
case "${1:-}" in
  -h | --help) echo "$usage" && exit 0 ;;
  "") echo "$usage" >&2 && exit 2 ;;
esac
py=$1
here=$(cd "$(dirname "$0")/.." && pwd)
pin=$(grep -o 'llama-cpp-python==[0-9.]*' "$here/pyproject.toml")
base_flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
wheel_flags="$base_flags -DLLAVA_BUILD=OFF"
avx512_flags="$base_flags -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
# /proc/cpuinfo flags the variant's compiler flags assume
avx512_requires="avx2 fma f16c bmi2 avx512f avx512cd avx512dq avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"
key=$(echo "$pin|$wheel_flags|$avx512_flags|$avx512_requires|$(uname -m)" | sha1sum | cut -c1-12)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/chunkpilot/llama/$key
pip=("$py" -m pip -q --disable-pip-version-check)
jobs=$(nproc)
mkdir -p "$cache"

if ! ls "$cache"/wheel/*.whl >/dev/null 2>&1; then
  echo "building $pin for any CPU with AVX2 (minutes; kept in $cache)"
  rm -rf "$cache/sdist" "$cache/wheel"
  "${pip[@]}" download --no-deps --no-binary :all: -d "$cache/sdist" "$pin"
  CMAKE_ARGS="$wheel_flags" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
    "${pip[@]}" wheel --no-deps --no-cache-dir -w "$cache/wheel.tmp" "$cache"/sdist/*.tar.gz
  mv "$cache/wheel.tmp" "$cache/wheel"
fi
"${pip[@]}" install --force-reinstall --no-deps "$cache"/wheel/*.whl
package=$("$py" -c 'import importlib.util as u; print(u.find_spec("llama_cpp").submodule_search_locations[0])')

if [ "$(uname -m)" = x86_64 ]; then
  if ! ls "$cache"/avx512/libggml-cpu.so* >/dev/null 2>&1; then
    echo "building its CPU kernels again with AVX-512 (VNNI, BF16; no AMX), a variant picked at run time"
    src=$(mktemp -d)
    tar -xzf "$cache"/sdist/*.tar.gz -C "$src" --strip-components=1
    # shellcheck disable=SC2086  # the flags are words
    cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      $avx512_flags -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >"$src/build.log" 2>&1 &&
      cmake --build "$src/build" --target ggml-cpu -j "$jobs" >>"$src/build.log" 2>&1 ||
      { tail -40 "$src/build.log"; exit 1; }
    rm -rf "$cache/avx512.tmp" && mkdir "$cache/avx512.tmp"
    cp -P "$src"/build/bin/libggml-cpu.so* "$cache/avx512.tmp/"
    echo "$avx512_requires" >"$cache/avx512.tmp/requires"
    rm -rf "$src" "$cache/avx512" && mv "$cache/avx512.tmp" "$cache/avx512"
  fi
  # the variant folder: the package's own libraries with the variant's CPU kernels in place of its own
  rm -rf "$package/lib-avx512" && mkdir "$package/lib-avx512"
  cp -P "$package"/lib/lib*.so* "$package/lib-avx512/"
  rm "$package"/lib-avx512/libggml-cpu.so*
  cp -P "$cache"/avx512/* "$package/lib-avx512/"
fi
