# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create or reuse the virtualenv at .venv; torch==2.13.0 goes in first so pip keeps the
# CPU build that lies on this machine's disk instead of fetching a multi-GB CUDA build.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.chunkpilot-installed

.PHONY: demo test test-fast

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/chunkpilot demo

# the structure is checked with the tests: lint, format, the one-way import contracts (pyproject.toml)
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

# the inner loop: the same checks, and the tests not marked slow (no servers, PostgreSQL or profiles)
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m "not slow"
