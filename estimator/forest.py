"""An ensemble's members predicted together: LightGBM's boosters, or the same trees compiled to
native code.

A first decision prices about 45 chunks with 5 members of 300 trees: LightGBM's own predictor
spends most of the decision's 3 ms walking them (docs/performance.md). Compiled (lleaves: the
trees as LLVM machine code for this CPU), the members are one multiclass model whose classes are
the members, read as raw scores, so one native call prices every member: the same sums to rounding
(lleaves adds the trees in blocks of 34, LightGBM one by one: about 1e-15 apart), several times
faster. Compiling takes a minute of one core, so it runs once per machine and model: the object
code is cached under the user's cache (chunkpilot.cache), keyed by the trees, the compiler's
versions and this CPU's name and features (a cache shared between machines never runs another
CPU's code). Training and cross-validation predict with LightGBM; the service compiles in the
background and swaps the compiled forest in when it is ready (predictor.model).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import lightgbm as lgb
import numpy as np

from chunkpilot.cache import user_cache_dir

# a tree of one leaf worth 0: pads a member whose training stopped early (no split left), so that
# every member has as many trees as the others, as a multiclass model's classes must
_EMPTY_TREE = (
    "num_leaves=1\nnum_cat=0\nsplit_feature=\nsplit_gain=\nthreshold=\ndecision_type=\nleft_child=\n"
    "right_child=\nleaf_value=0\nleaf_weight=\nleaf_count=\ninternal_value=\ninternal_weight=\n"
    "internal_count=\nis_linear=0\nshrinkage=1\n"
)


def _parts(booster: lgb.Booster) -> tuple[list[str], list[str], str]:
    """(the header's lines, each tree's block without its `Tree=` line, what follows the trees) of
    a booster's text."""
    head, _, rest = booster.model_to_string().partition("\nTree=")
    body, _, tail = ("Tree=" + rest).partition("\nend of trees")
    blocks = (block.strip("\n") for block in re.split(r"\n{2,}", body))
    trees = [block.split("\n", 1)[1] + "\n" for block in blocks if block.startswith("Tree=")]
    return head.split("\n"), trees, tail


def fused_text(boosters: list[lgb.Booster]) -> str:
    """The members as the classes of one multiclass model (tree t of member k is tree t*K + k)."""
    headers, forests, tails = zip(*(_parts(b) for b in boosters), strict=True)
    k, depth = len(boosters), max(len(trees) for trees in forests)
    forests = [trees + [_EMPTY_TREE] * (depth - len(trees)) for trees in forests]
    blocks = [f"Tree={t * k + m}\n{forests[m][t]}" for t in range(depth) for m in range(k)]
    sizes = " ".join(str(len(block) + 1) for block in blocks)
    replaced = {"num_class": str(k), "num_tree_per_iteration": str(k), "tree_sizes": sizes}
    header = [f"{key}={replaced[key]}" if (key := line.split("=", 1)[0]) in replaced else line for line in headers[0]]
    if not any(line.startswith("tree_sizes=") for line in header):
        header.append(f"tree_sizes={sizes}")
    # the tail (importances, parameters, pandas' categories) is the first member's: lleaves reads it
    return "\n".join(header).rstrip("\n") + "\n\n" + "\n".join(blocks) + "\nend of trees" + tails[0]


def _host() -> str:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot tell: lleaves then compiles for the CPU's name alone
        features = ""
    return f"{llvm.get_host_cpu_name()} {features}"


FLAGS = {"raw_score": True}  # lleaves' compile options (the rest its defaults): part of the cache key


def _key(text: str) -> str:
    """The cache's name for these trees compiled by this lleaves and LLVM for this CPU."""
    tools = f"lleaves {version('lleaves')} llvmlite {version('llvmlite')} {sorted(FLAGS.items())}"
    return hashlib.sha256(f"{text}\n{_host()}\n{tools}".encode()).hexdigest()[:24]


def _probe(features: int) -> np.ndarray:
    """Rows that walk many paths: what a compiled object must answer as it was compiled to."""
    return np.outer(np.linspace(0.0, 1.0, 16), np.geomspace(1.0, 1e9, features))


def _intact(target: Path) -> bool:
    """Whether the cached object is there and is the bytes its digest was taken of."""
    digest = target.with_suffix(".sha256")
    try:
        return hashlib.sha256(target.read_bytes()).hexdigest() == digest.read_text().strip()
    except OSError:
        return False


def _cache(folder: Path | None) -> Path | None:
    """The cache folder, made if need be; None where it cannot be (a read-only home): no cache."""
    try:
        folder = folder or user_cache_dir() / "forests"
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    except OSError:
        return None


def compile_forest(boosters: list[lgb.Booster], cache: Path | None = None):
    """The boosters compiled as one lleaves model of raw scores, from the cache when it holds them.
    A new object enters the cache only once a child process has loaded it and answered the probe
    as this process does (LLVM aborts the process that loads a damaged object: never this one),
    with its digest beside it, checked before every later load."""
    import lleaves

    text = fused_text(boosters)
    with tempfile.TemporaryDirectory() as tmp:
        model_file = Path(tmp) / "forest.txt"
        model_file.write_text(text)
        model = lleaves.Model(model_file=str(model_file))
        folder, key = _cache(cache), _key(text)
        target = None if folder is None else folder / f"{key}.o"
        if target is not None and _intact(target):
            model.compile(cache=str(target), **FLAGS)
            return model
        # Trees inlined (lleaves' default): on the Intel Xeon 5e4830eb8869, 5 x 300 trees compile in
        # about 65 s of one core and price a first decision's 45 chunks in 0.43 ms; not inlined, 11 s
        # and 0.58 ms (the small code model would be faster still, but lleaves keeps the large one
        # for forests of a thousand trees and more)
        written = Path(tmp) / "forest.o"
        model.compile(cache=str(written), **FLAGS)
        if target is not None and written.exists():
            probe = _probe(model.num_feature())
            np.save(Path(tmp) / "probe.npy", probe)
            np.save(Path(tmp) / "expected.npy", model.predict(probe, n_jobs=1))
            checked = subprocess.run(
                [sys.executable, "-m", "estimator.forest", tmp], capture_output=True, timeout=600, check=False
            )
            if checked.returncode == 0:
                partial = folder / f".{key}.{os.getpid()}.{threading.get_ident()}"
                try:  # whole under a private name beside it, then renamed: no reader loads half a file
                    partial.write_bytes(written.read_bytes())
                    os.replace(partial, target)
                    target.with_suffix(".sha256").write_text(hashlib.sha256(target.read_bytes()).hexdigest())
                except OSError:  # a full disk: no cache this time, the compiled model serves all the same
                    pass
                finally:
                    partial.unlink(missing_ok=True)
    return model


def _check(folder: Path) -> int:
    """In a child process: load the object compiled in `folder` and answer its probe; 0 if the
    answers are the compiling process's, bit for bit."""
    import lleaves

    model = lleaves.Model(model_file=str(folder / "forest.txt"))
    model.compile(cache=str(folder / "forest.o"), **FLAGS)
    answered = model.predict(np.load(folder / "probe.npy"), n_jobs=1)
    return 0 if np.array_equal(answered, np.load(folder / "expected.npy")) else 1


@dataclass
class Forest:
    """The members' boosters; `predict` is [members, rows] of raw scores, compiled once `compile`
    has run (its predictions equal LightGBM's to rounding: tests/test_forest.py)."""

    boosters: list[lgb.Booster] = field(default_factory=list)
    compiled: object | None = field(default=None, repr=False)  # an lleaves model, or None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def predict(self, x: np.ndarray) -> np.ndarray:
        compiled = self.compiled
        if compiled is not None:
            out = compiled.predict(x, n_jobs=1)  # [rows, members]; [rows] for one member
            return out[None] if out.ndim == 1 else out.T
        # a few rows gain nothing from OpenMP, whose threads would spin against the engine's
        return np.stack([b.predict(x, num_threads=1) for b in self.boosters])

    def save(self, folder: Path, kind: str) -> None:
        """LightGBM's text format, a file per member (never a pickle; never the compiled code)."""
        for i, booster in enumerate(self.boosters):
            booster.save_model(str(folder / f"{kind}-{i}.lgb"))

    @classmethod
    def load(cls, folder: Path, kind: str, size: int) -> Forest:
        return cls([lgb.Booster(model_file=str(folder / f"{kind}-{i}.lgb")) for i in range(size)])

    def compile(self, cache: Path | None = None) -> None:
        with self._lock:
            if self.compiled is None and self.boosters:
                self.compiled = compile_forest(self.boosters, cache)


if __name__ == "__main__":
    sys.exit(_check(Path(sys.argv[1])))
