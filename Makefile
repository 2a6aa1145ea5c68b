# Two commands on a fresh machine:
#   make serve   start the service on its embedded default (SQLite ledger, in-process cache, demo graph)
#   make test    run the whole test suite
# and, with PostgreSQL and Redis on 127.0.0.1, `make bench` prints the speed targets beside
# this machine's figures.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test fuzz lint typecheck check bench bench-ab clean

# uv installs the project and its pinned ranges in about 3 s where pip took 35 s (both from a
# warm cache; the same versions). The venv is made without pip (copying pip into it took 4 s):
# the machine's pip puts uv in it, and uv adds pip with the project. Where uv cannot install
# (uv reads PyPI, not pip's configured indexes) the venv gets its own pip, which installs
# instead. Bytecode is then written once for what the service and its tests import (processes
# where PYTHONDONTWRITEBYTECODE is set would otherwise compile every module they import):
# everything but NO_BYTECODE, the parts of the dependencies nothing here imports (their test
# suites, Ray's libraries beside its core, the installers, the type checker), 41% of the files
# (uv's --compile-bytecode of all of them took 22-31 CPU-s, this 16-24, same hour, busy machine).
# Last, numba's kernels are compiled into their on-disk cache (about 25 CPU-s, 11-12 s on two
# cores), once per install, as a deployment would: the first server and the test run then load
# them (make test still compiles, before its workers start, any that changed since).
NO_BYTECODE := /tests?/|/ray/(rllib|train|tune|llm|serve|data)/|/site-packages/(pip|setuptools|mypy|mypyc)/
$(STAMP): pyproject.toml
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python install --quiet "uv>=0.5,<1" \
		&& $(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[dev]" "pip>=23" \
		|| ($(BIN)/python -m ensurepip --upgrade \
			&& $(BIN)/python -m pip install --quiet -e ".[dev]")
	$(BIN)/python -m compileall -q -j 0 -x '$(NO_BYTECODE)' \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null
	$(BIN)/python -m service.mechanisms.compile_kernels --parallel >/dev/null
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/python -m service db upgrade
	$(BIN)/python -m service serve

# Three xdist workers on two cores: a part of the suite's time is spent waiting (on servers
# starting, subprocesses, sleeps), and a third worker fills it; a fourth does not (the suite is
# CPU-bound). Quiet 2-core machine, a fresh clone's tests, 2026-11-29: 378.3 s with two
# workers, 340.2 s with three, 351.4 s with four. TEST_WORKERS changes it.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=10 $(PYTEST_ARGS)

# Schemathesis over every endpoint with user, service and admin keys, on SQLite and on
# PostgreSQL + Redis, with many more examples than the suite's run (FUZZ_EXAMPLES per mode).
FUZZ_EXAMPLES ?= 60
fuzz: $(STAMP)
	PPR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 2 -q tests/test_api_fuzz.py

# Every speed target beside this checkout's figure, measured in one run of two to three minutes
# (benchmarks/speed_targets.py): loadtest on PostgreSQL + Redis with two workers on ego-Facebook
# (../shared/data/facebook_combined.txt) and bench on a generated 100k-node / 2M-edge graph,
# with the machine's load average at the start and the end. It creates and drops a database of
# its own and removes its Redis keys; it exits 0 when targets are missed (a report), 1 when a
# measurement failed. BENCH_ARGS passes options (--json, --duration, --generate, --graph, ...).
# Run it on a quiet machine (load average under 1.5).
bench: $(STAMP)
	$(BIN)/python benchmarks/speed_targets.py $(BENCH_ARGS)

# The whole request path before and after a change, side by side in one run, on PostgreSQL +
# Redis with two workers per side (benchmarks/ab_load.py). Run it on a quiet machine (load
# average under 1.5): BEFORE is the older commit (default: the parent of HEAD), its checkout
# made once in ../bench-before-<commit>; BENCH_ARGS passes options to ab_load.py.
BEFORE ?= HEAD~1
bench-ab: $(STAMP)
	$(BIN)/python benchmarks/ab_load.py --before $(BEFORE) \
		--before-dir ../bench-before-$$(git rev-parse --short $(BEFORE)) $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check service tests benchmarks
	$(BIN)/ruff format --check service tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.db
