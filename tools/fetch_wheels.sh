#!/usr/bin/env bash
# The wheels tools/gpu_profile.sh may need on a machine that has torch, transformers, numpy, pandas,
# pyarrow and tokenizers but not ChunkPilot's light dependencies (pydantic, pydantic-settings, what
# they need, PyYAML), downloaded here for that machine's Python (it has no network).
#   tools/fetch_wheels.sh [DIR] [PYTHON_VERSION]     default: tools/wheels 3.12 (the GPU machine's)
set -euo pipefail
case ${1:-} in -*) sed -n "2,5p" "$0"; exit 0;; esac
dir=${1:-tools/wheels}
version=${2:-3.12}
pip=${PIP:-.venv/bin/pip}
"$pip" download --disable-pip-version-check -q --only-binary=:all: --python-version "$version" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --dest "$dir" "pydantic>=2.7,<3" "pydantic-settings>=2.3" "pyyaml>=6"
echo "$(ls "$dir" | wc -l) wheels for Python $version in $dir ($(du -sh "$dir" | cut -f1))"
