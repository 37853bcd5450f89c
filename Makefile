# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create or reuse the virtualenv at .venv; torch==2.13.0 goes in first so pip keeps the
# CPU build that lies on this machine's disk instead of fetching a multi-GB CUDA build.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check
STAMP := $(VENV)/.chunkpilot-installed

# llama.cpp (the `llama` extra) is built by tools/build_llama.sh, not by pip's default -march=native
# (which dies on an Intel Xeon with AMX): for any x86-64 CPU with AVX2, plus an AVX-512 variant of
# its kernels that engine/llama_lib.py picks at run time where the CPU has it.
.PHONY: demo test test-fast

$(STAMP): pyproject.toml tools/build_llama.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	tools/build_llama.sh $(PY)
	$(PIP) install -e '.[dev,llama]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/chunkpilot demo

# The tests run in two workers, whole files each (a module's PostgreSQL + mlflow server stays one):
# the suite is mostly process starts, servers and MLflow on one core at a time (14.4 min in one
# process, 8.2 in two on 2 cores: see the README). OpenMP threads sleep instead of spinning while
# they wait, since both workers' torch threads share the cores.
# A test that runs llama.cpp is marked `native` and runs in a child process (tests/conftest.py), so a
# crash fails that test, named, instead of killing a worker; and a run that still hangs is stopped
# after 40 minutes, with every worker's stack dumped by faulthandler_timeout before that.
PYTEST := OMP_WAIT_POLICY=PASSIVE timeout --kill-after=60 40m $(PY) -m pytest -q -n 2 --dist loadfile

# the structure is checked with the tests: lint, format, the one-way import contracts (pyproject.toml);
# the slowest tests are named: what to trim when the run nears 15 minutes
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PYTEST) --durations=12

# the inner loop: the same checks, and the tests not marked slow (no servers, PostgreSQL or profiles)
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PYTEST) -m "not slow"
