"""tools/gpu_profile.sh, the GPU profile's one call, run on this CPU the way it runs on the GPU
machine: in a Python that holds only what that machine has (torch, transformers, numpy, pandas,
pyarrow, tokenizers, PyYAML and their own dependencies), with the rest installed from carried
wheels, and the GPU spec swapped for a tiny CPU one."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from profiler.spec import Spec

pytestmark = pytest.mark.slow

# what the GPU machine's Python comes with (issue 23); pip stands for its own installer
GPU_MACHINE = ["torch", "transformers", "numpy", "pandas", "pyarrow", "pyyaml", "tokenizers", "pip"]
# and what it lacks, though here a dependency of those (huggingface_hub's CLI) pulls it in
LACKS = {
    "pydantic",
    "pydantic-core",
    "pydantic_core",
    "annotated-types",
    "annotated_types",
    "typing-inspection",
    "typing_inspection",
}
TINY_CPU = {
    "name": "gpu-path-check",
    "device": "cpu",
    "order": "as-written",
    "repeats": 1,
    "warmup": 1,
    "chunk_sizes": [32, 64, "full"],
    "sweeps": [{"models": ["llama-tiny"], "contexts": [96, 160], "attention": [{"window": None}], "threads": [1]}],
}


def _closure(names: list[str]) -> set[str]:
    """The distributions `names` need to import, following their (non-extra) requirements."""
    seen, todo = set(), list(names)
    while todo:
        dist = md.distribution(todo.pop())
        if dist.metadata["Name"].lower() in seen | LACKS:
            continue
        seen.add(dist.metadata["Name"].lower())
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            name = re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]
            try:
                md.distribution(name)
            except md.PackageNotFoundError:  # a platform-specific requirement this machine skips
                continue
            todo.append(name)
    return seen


def gpu_machine_python(root: Path) -> Path:
    """A virtualenv that sees only the GPU machine's distributions, linked from this one's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    packages = root / "packages"
    packages.mkdir()
    for name in _closure(GPU_MACHINE) - LACKS:
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (packages / top).exists():
                (packages / top).symlink_to(source)
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (site / "gpu_machine.pth").write_text(f"{packages}\n")
    return root / "venv" / "bin" / "python"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-machine")
    python = gpu_machine_python(root)
    lacks = subprocess.run([python, "-c", "import pydantic"], capture_output=True)
    assert lacks.returncode != 0  # the check below is only worth something if pydantic must travel
    wheels = root / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    pip = Path(sys.executable).with_name("pip")
    subprocess.run(
        ["tools/fetch_wheels.sh", str(wheels), version], cwd=ROOT, check=True, env={**os.environ, "PIP": str(pip)}
    )
    return root, python, wheels


def _run(machine, spec: dict) -> subprocess.CompletedProcess:
    root, python, wheels = machine
    spec_file = root / f"{spec['name']}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    out = root / f"out-{spec['name']}"
    env = {**os.environ, "PYTHON": str(python), "TMPDIR": str(root)}
    args = ["tools/gpu_profile.sh", "--spec", str(spec_file), "--wheels", str(wheels), "--out", str(out)]
    return subprocess.run([*args, "--budget-minutes", "3"], cwd=ROOT, env=env, capture_output=True, text=True)


def test_the_gpu_profile_script_measures_and_packs_with_only_the_carried_wheels(machine, tmp_path):
    done = _run(machine, TINY_CPU)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing from" in done.stdout and "pydantic" in done.stdout  # only what was missing
    assert "matmul_gflops" in done.stdout  # the machine's descriptors, printed
    archive = machine[0] / "out-gpu-path-check" / "gpu-profile.tar.gz"
    with tarfile.open(archive) as tar:  # one archive: the device tool brings back at most 8 files
        tar.extractall(tmp_path, filter="data")
    files = list((tmp_path / "ttft" / "gpu-path-check").glob("*/*.parquet"))
    assert len(files) == len(Spec.from_dict(TINY_CPU).configs) == 2
    rows = pd.concat(pd.read_parquet(f) for f in files)
    assert sorted(rows.groupby("context_length").chunk_size.apply(sorted).sum()) == sorted([32, 64, 96, 32, 64, 160])
    assert (rows.device_kind == "cpu").all() and rows.chunk_ms.map(len).eq(rows.num_chunks).all()
    assert list((tmp_path / "hardware").glob("*.json"))


def test_without_cuda_a_gpu_spec_stops_with_one_line(machine):
    done = _run(machine, {**TINY_CPU, "name": "needs-cuda", "device": "cuda"})
    assert done.returncode == 3
    assert done.stderr.strip().count("\n") == 0 and "CUDA" in done.stderr
