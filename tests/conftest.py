import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def engines():
    """Engines are slow to build (weights, tokenizer): one per (model, dtype, kernel) per session."""
    from engine.engine import Engine, EngineConfig

    built: dict = {}

    def get(model: str, dtype: str = "float32", attn_impl: str = "sdpa") -> Engine:
        key = (model, dtype, attn_impl)
        if key not in built:
            built[key] = Engine(EngineConfig(model=model, dtype=dtype, attn_impl=attn_impl, threads=2))
        return built[key]

    return get
