"""The child's side of a `native` test (conftest.py): the test function, found by its module's
name and its own, called with the fixtures' values the parent resolved. The module is imported by
name (tests/ is on the path the child inherits), so what it defines pickles both ways."""

from __future__ import annotations

import importlib
from typing import Any


def call_test(module: str, name: str, kwargs: dict[str, Any]) -> None:
    getattr(importlib.import_module(module), name)(**kwargs)
