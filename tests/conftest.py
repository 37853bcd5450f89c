import atexit
import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]


def _scratch(variable: str, prefix: str, name: str = "") -> None:
    """`variable` names a folder (or `name` in it) of the test session's own, made by the process
    that found it unset (pytest's, before its workers, which inherit it) and removed when it exits."""
    if variable not in os.environ:
        folder = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ[variable] = str(Path(folder) / name) if name else folder


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the engine's per-user cache (measured hardware descriptors): the tests' own, never the user's
_scratch("CHUNKPILOT_CACHE_DIR", "chunkpilot-cache-")
# the telemetry of the tests' prefills: never into the repository's data/
_scratch("CHUNKPILOT_TELEMETRY_DIR", "chunkpilot-telemetry-")
# the run records of the tests' trainings and races: never into the repository's results/
_scratch("CHUNKPILOT_RESULTS", "chunkpilot-results-", "runs.jsonl")
# answers are the model's own picks unless a test turns exploring on (tests/test_telemetry.py)
os.environ.setdefault("CHUNKPILOT_EXPLORE_BUDGET", "0")
# a service's answers before its decision table is built are the recipe's own, whatever a decision
# costs against the tests' tiny prefills, unless a test says otherwise (tests/test_table.py)
os.environ.setdefault("CHUNKPILOT_DECISION_BUDGET", "1")
# and no decision tables are built behind them: seconds of a core per kind of request, against the
# tests' own timings (tests/test_table.py builds and checks them)
os.environ.setdefault("CHUNKPILOT_DECISION_TABLE", "0")
# nor are forests compiled behind them (seconds of a core per model; tests/test_forest.py compiles)
os.environ.setdefault("CHUNKPILOT_COMPILED_FORESTS", "0")
# the tests' profiles are fixtures timed beside the other worker, not measurements: none is left out
# for it (tests/test_profiler.py sets the limit where it checks it)
os.environ.setdefault("CHUNKPILOT_CONTENDED_CORES", "1000")


@pytest.fixture(scope="session")
def engines():
    """Engines are slow to build (weights, tokenizer): one per (model, dtype, kernel) per session. One
    thread each: two pytest workers share two cores, and what these tests check (tokens, logits,
    rows, peaks) does not depend on the thread count (one-token chunks ran 15% faster alone)."""
    from engine.config import EngineConfig
    from engine.engine import Engine

    built: dict = {}

    def get(model: str, dtype: str = "float32", attn_impl: str | None = None) -> Engine:
        key = (model, dtype, attn_impl)
        if key not in built:
            built[key] = Engine(EngineConfig(model=model, dtype=dtype, attn_impl=attn_impl, threads=1))
        return built[key]

    return get


SMALL_SPEC = {
    "name": "small",
    "repeats": 1,
    "chunk_sizes": [16, 32, 64, 128, "full"],
    "sweeps": [
        {
            "models": ["llama-tiny", "SHAPE"],
            "contexts": [64, 160, 400],
            "attention": [
                {"window": None},
                {"window": 64, "layout": "shift"},
                {"window": 128, "layout": "ring", "sinks": 4},
            ],
            "threads": [1, 2],
        }
    ],
}


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory, worker_id):
    """A real (if small and quick) profiled dataset: 2 models x 3 contexts x 3 attention configs x
    2 thread counts, measured by the harness. Returns its root (pass as --data), a copy of its own
    for each pytest-xdist worker: the first to ask measures it, the others wait and copy (two
    profiles at once on two cores would only time each other)."""
    if worker_id == "master":  # one process: nothing to share
        return profile_small(tmp_path_factory.mktemp("small-data"))
    shared = tmp_path_factory.getbasetemp().parent / "small-data"  # this run's, seen by every worker
    with FileLock(f"{shared}.lock"):
        if not (shared / "measured").exists():
            profile_small(shared)
            (shared / "measured").touch()
    own = tmp_path_factory.mktemp("small-data") / "ttft"
    shutil.copytree(shared / "ttft", own)
    return own


def profile_small(root: Path) -> Path:
    import yaml

    from profiler.run import run_profile
    from profiler.spec import Spec

    root.mkdir(parents=True, exist_ok=True)
    shape = root / "tiny-qwen.yaml"
    shape.write_text(
        "family: qwen2\nnum_layers: 2\nhidden_size: 128\nnum_heads: 4\nnum_kv_heads: 1\n"
        "intermediate_size: 256\nvocab_size: 1024\n"
    )
    spec = dict(SMALL_SPEC, sweeps=[dict(SMALL_SPEC["sweeps"][0], models=["llama-tiny", str(shape)])])
    (root / "small.yaml").write_text(yaml.safe_dump(spec))
    run_profile(Spec.from_file(root / "small.yaml"), root / "ttft")
    return root / "ttft"


@pytest.fixture(scope="session")
def trained_store(small_dataset, tmp_path_factory):
    """A real MLflow store (SQLite + artifacts) holding a champion trained on `small_dataset`."""
    return train_into_store(small_dataset, tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="session")
def known_machine(small_dataset) -> dict:
    """The machine `small_dataset` was measured on, as `auto` names it (its id and its descriptors,
    which an outcome must carry): the trained store's model knows it, where a described machine it
    never profiled gets the anchor's size until it learns."""
    import pandas as pd

    from chunkpilot.contract import Hardware

    row = pd.read_parquet(next(small_dataset.rglob("*.parquet"))).iloc[0]
    return Hardware(**{name: row[name] for name in Hardware.model_fields}).model_dump(mode="json")


QUICK_TREES = 40


def quick(**params: float) -> dict:
    """train()'s keywords for tests that need a champion, not the training table: the served recipe
    beside the quick baselines, on QUICK_TREES trees a member (LightGBM `params` over that), so a
    store costs seconds, not the minutes of judging every recipe and baseline at full size."""
    return {"compare": "quick", "params": {"num_boost_round": QUICK_TREES, **params}}


QUICK_ARGS = ("--compare", "quick", "--n-estimators", str(QUICK_TREES))  # quick() on the command line


@functools.cache
def _empty_store() -> bytes:
    """An empty MLflow SQLite store, built by MLflow once a session (its migrations take 2 s a store)."""
    with tempfile.TemporaryDirectory(prefix="chunkpilot-store-") as folder:
        return _migrated(Path(folder) / "mlflow.db")


def _migrated(path: Path) -> bytes:
    """The bytes of a new MLflow SQLite store at `path`, its tables made by MLflow."""
    from mlflow import MlflowClient

    migrations = logging.getLogger("mlflow.store.db.utils")  # says so at INFO: not the calling test's output
    level = migrations.level
    migrations.setLevel(logging.WARNING)
    try:
        MlflowClient(f"sqlite:///{path}").search_experiments()
    finally:
        migrations.setLevel(level)
    return path.read_bytes()


def sqlite_store(path: Path) -> str:
    """The tracking URI of a new, empty MLflow store in the SQLite file `path` (a copy of the
    session's freshly migrated one); artifacts go where the experiment says (mlruns/ in the cwd)."""
    path.write_bytes(_empty_store())
    return f"sqlite:///{path}"


def train_into_store(data: Path, root: Path) -> str:
    """`chunkpilot train` on `data` into a new MLflow store under `root` (SQLite, artifacts in
    root/mlruns); returns its tracking URI."""
    from training.train import train

    uri = sqlite_store(root / "mlflow.db")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        patch.chdir(root)
        train(data, **quick())
    return uri


# fixtures that profile a dataset or start a server: a test that uses one is `slow` (make test-fast skips it)
SLOW_FIXTURES = {"small_dataset", "trained_store", "mlflow_server", "server", "service"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


NATIVE_TIMEOUT_S = 900.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked `native` runs llama.cpp, whose crash (a SIGILL where a build meets a CPU that
    refuses it) would kill the pytest worker and leave its file's other tests unrun: it runs in a
    child process instead, and the child's death fails it, naming the signal (its Python stack on
    stderr, from faulthandler). Its fixtures' values are resolved here and must pickle."""
    if pyfuncitem.get_closest_marker("native") is None:
        return None
    from isolated import call_test

    from engine.isolation import run_in_child

    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    module = pyfuncitem.module.__name__
    run_in_child(call_test, module, pyfuncitem.originalname, kwargs, what=pyfuncitem.nodeid, timeout_s=NATIVE_TIMEOUT_S)
    return True
