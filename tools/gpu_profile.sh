#!/usr/bin/env bash
# The GPU profile in one call, run from the repository root on the GPU machine (issue 23):
#   tools/gpu_profile.sh [--spec FILE] [--budget-minutes M] [--wheels DIR] [--out DIR]
# defaults: data/specs/gpu-h200.yaml, 6 minutes of measuring (the whole call ends inside 10),
# tools/wheels (made here by tools/fetch_wheels.sh), $OUT or ./gpu-out.
# It checks the device the spec asks for (no CUDA: one line, exit 3), installs from the carried
# wheels only the modules this Python lacks, profiles without MLflow, prints the per-config
# summary and the machine's descriptors, and packs what it measured into one archive in --out.
# $PYTHON picks the interpreter (default python3).
set -euo pipefail
spec=data/specs/gpu-h200.yaml
budget=6
wheels=tools/wheels
out=${OUT:-gpu-out}
while [ $# -gt 0 ]; do
    case $1 in
        --spec) spec=$2; shift 2 ;;
        --budget-minutes) budget=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "gpu_profile: unknown argument '$1' (allowed: --spec, --budget-minutes, --wheels, --out)" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}
[ -f "$spec" ] || { echo "gpu_profile: --spec $spec does not exist" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-profile.XXXXXX")

device=$("$py" -c 'import re, sys; m = re.search(r"^device:\s*(\w+)", open(sys.argv[1]).read(), re.M); print(m[1] if m else "cpu")' "$spec")
if [ "$device" = cuda ] && ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_profile: the spec needs CUDA and torch.cuda.is_available() is False here: nothing measured" >&2
    exit 3
fi

# what the profiler imports beyond torch/transformers/numpy/pandas/pyarrow/tokenizers: module -> distribution
missing=$("$py" - <<'PY'
import importlib.util
needed = {"pydantic": "pydantic", "pydantic_core": "pydantic-core", "annotated_types": "annotated-types",
          "typing_inspection": "typing-inspection", "typing_extensions": "typing-extensions", "yaml": "pyyaml",
          "pydantic_settings": "pydantic-settings", "dotenv": "python-dotenv"}
print(" ".join(dist for module, dist in needed.items() if importlib.util.find_spec(module) is None))
PY
)
export PYTHONPATH="$PWD"
if [ -n "$missing" ]; then
    echo "gpu_profile: installing from $wheels: $missing"
    "$py" -m pip install -q --disable-pip-version-check --no-deps --no-index --find-links "$wheels" \
        --target "$work/site" $missing
    export PYTHONPATH="$PWD:$work/site"
fi
"$py" -c 'import pydantic, yaml, pandas, pyarrow, transformers, tokenizers' || {
    echo "gpu_profile: the profiler's imports fail after installing '$missing' from $wheels" >&2; exit 4; }

status=0
"$py" -m cli profile --spec "$spec" --out "$work/ttft" --budget-minutes "$budget" --no-mlflow || status=$?
echo "machine descriptors:"
cat "$work"/hardware/*.json 2>/dev/null || echo "(none measured)"
mkdir -p "$out"
tar -czf "$out/gpu-profile.tar.gz" -C "$work" ttft hardware 2>/dev/null \
    || tar -czf "$out/gpu-profile.tar.gz" -C "$work" --files-from /dev/null
echo "packed: $out/gpu-profile.tar.gz ($(du -h "$out/gpu-profile.tar.gz" | cut -f1)); profile exit status $status"
exit $status
