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
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,llama]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/chunkpilot demo

# The tests run in two workers, whole files each (a module's PostgreSQL + mlflow server stays one):
# the suite is mostly process starts, servers and MLflow on one core at a time (14.4 min in one
# process, 8.2 in two on 2 cores: see the README). OpenMP threads sleep instead of spinning while
# they wait, since both workers' torch threads share the cores.
PYTEST := OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -n 2 --dist loadfile

# the structure is checked with the tests: lint, format, the one-way import contracts (pyproject.toml)
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PYTEST)

# the inner loop: the same checks, and the tests not marked slow (no servers, PostgreSQL or profiles)
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PYTEST) -m "not slow"
