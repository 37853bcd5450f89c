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
CPU's code), by one process at a time (a lock per key: two services or CLI runs started together
compile once), from the trees kept beside the object (an asker that exits mid-compile, a CLI run,
still leaves the object for the next). Training and cross-validation predict with LightGBM; the service compiles in the
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
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import lightgbm as lgb
import numpy as np

from chunkpilot.cache import user_cache_dir, write_atomically

COMPILE_S = 1800  # the longest a compile may take (5 x 300 inlined trees: a few minutes of a core)
BUSY, POLL_S = 2, 1.0  # the child's exit code when another process compiles the same key; its poll
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


# lleaves' code model: the large one. The small one (about 0.09 ms faster a decision) checked out in
# the child that compiled it and then segfaulted once as a test worker loaded the same object
# (AMD EPYC 166832b5c42b): its 32-bit relocations depend on where a large process maps it
CODE_MODEL = "large"


def _key(text: str) -> str:
    """The cache's name for these trees compiled by this lleaves and LLVM for this CPU."""
    tools = f"lleaves {version('lleaves')} llvmlite {version('llvmlite')} raw {CODE_MODEL}"
    return hashlib.sha256(f"{text}\n{_host()}\n{tools}".encode()).hexdigest()[:24]


def _probe(features: int) -> np.ndarray:
    """Rows that walk many paths: what a compiled object must answer as LightGBM does."""
    return np.outer(np.linspace(0.0, 1.0, 16), np.geomspace(1.0, 1e9, features))


def _answers_as_lightgbm(model, model_file: Path) -> bool:
    """Whether the compiled `model` answers the probe as LightGBM reads the same trees (raw scores)."""
    probe = _probe(model.num_feature())
    expected = lgb.Booster(model_file=str(model_file)).predict(probe, raw_score=True, num_threads=1)
    answered = model.predict(probe, n_jobs=1).reshape(len(probe), -1)  # [rows, members], one member too
    return bool(np.allclose(answered, expected.reshape(len(probe), -1), rtol=0, atol=1e-9))


def _intact(target: Path) -> bool:
    """Whether the cached object is there and is the bytes its digest was taken of."""
    try:
        return hashlib.sha256(target.read_bytes()).hexdigest() == target.with_suffix(".sha256").read_text().strip()
    except OSError:
        return False


def _cache(folder: Path | None) -> Path | None:
    """The cache folder, made if need be; None where it cannot be (a read-only home)."""
    try:
        folder = folder or user_cache_dir() / "forests"
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    except OSError:
        return None


def compile_forest(boosters: list[lgb.Booster], cache: Path | None = None):
    """The boosters compiled as one lleaves model of raw scores. LLVM compiles in a child process
    (a minute of a core and a gigabyte for 5 x 300 inlined trees, and a compiler that fails takes
    only the child down), which loads what it wrote, checks it against LightGBM and caches it with
    its digest; this process loads only an object whose digest holds and checks it again. On the
    Intel Xeon 5e4830eb8869, 5 x 300 trees price a first decision's 45 chunks in 0.42 ms (the large
    code model; 0.33 ms small, 0.58 ms not inlined), where LightGBM takes about 2.4 ms."""
    import lleaves

    text = fused_text(boosters)
    with tempfile.TemporaryDirectory() as tmp:
        folder = _cache(cache) or Path(tmp)  # no cache: compiled all the same, for this process only
        key = _key(text)
        target = folder / f"{key}.o"
        # the trees beside their object, not in this process's temporary folder: a compile this
        # process leaves behind when it exits (a CLI run) still lands for the next one
        model_file = _written(folder / f"{key}.txt", text)
        if not _intact(target):
            child = [sys.executable, "-m", "estimator.forest", str(model_file), str(target)]
            if subprocess.run(child, capture_output=True, timeout=COMPILE_S, check=False).returncode == BUSY:
                _wait_for(target)
        if _intact(target):  # the child cached it only once it answered as LightGBM does
            model = lleaves.Model(model_file=str(model_file))
            model.compile(cache=str(target), raw_score=True, fcodemodel=CODE_MODEL)
            if _answers_as_lightgbm(model, model_file):
                return model
    raise RuntimeError("lleaves compiled no object that answers as LightGBM does")


def _compile_and_check(model_file: Path, target: Path) -> int:
    """In a child process: compile, load what was written, check it against LightGBM, and only then
    put it in the cache with its digest (under a private name, then renamed: no reader sees half a
    file). 0 when cached; BUSY, compiling nothing, while another process compiles the same key."""
    import lleaves

    lock = target.with_suffix(".lock")
    if not _claim(lock):
        return BUSY
    partial = target.with_name(f".{target.stem}.{os.getpid()}")
    try:
        lleaves.Model(model_file=str(model_file)).compile(cache=str(partial), raw_score=True, fcodemodel=CODE_MODEL)
        loaded = lleaves.Model(model_file=str(model_file))
        loaded.compile(cache=str(partial), raw_score=True, fcodemodel=CODE_MODEL)
        if not partial.exists() or not _answers_as_lightgbm(loaded, model_file):
            return 1
        digest = hashlib.sha256(partial.read_bytes()).hexdigest()
        os.replace(partial, target)
        target.with_suffix(".sha256").write_text(digest)
        return 0
    finally:
        partial.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


def _claim(lock: Path) -> bool:
    """Whether this process now holds `lock` (a file naming its pid); a lock whose process is gone
    is taken over."""
    for _ in range(2):
        try:
            with os.fdopen(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "w") as f:
                f.write(str(os.getpid()))
            return True
        except FileExistsError:
            if _holder_alive(lock):
                return False
            lock.unlink(missing_ok=True)  # its compiler died: stale
    return False


def _holder_alive(lock: Path) -> bool:
    """Whether the process named in `lock` runs; a lock not yet written is its claimant's for a moment."""
    try:
        pid = lock.read_text()
        if not pid:
            return time.time() - lock.stat().st_mtime < POLL_S * 10
        os.kill(int(pid), 0)
        return True
    except (OSError, ValueError):  # its process is gone (or the lock with it)
        return False


def _wait_for(target: Path) -> None:
    """Until the process compiling `target` has cached it or is gone (COMPILE_S at most)."""
    lock, end = target.with_suffix(".lock"), time.monotonic() + COMPILE_S
    while time.monotonic() < end and not _intact(target) and lock.exists() and _holder_alive(lock):
        time.sleep(POLL_S)


def _written(path: Path, text: str) -> Path:
    """`path` holding `text`, written under a private name and renamed (no reader sees half); a
    file there already holds it (its name is the digest of the text: `_key`)."""
    if not path.is_file():
        write_atomically(path, text)
    return path


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
    sys.exit(_compile_and_check(Path(sys.argv[1]), Path(sys.argv[2])))
