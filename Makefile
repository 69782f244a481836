# Mosaic: the two commands are `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-all lint bench sim clean

$(BIN)/python:
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) (Python 3.11+) on PATH, or run: make PY=python3 ..."; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)  ## start NATS, every service, a simulated 10-node cluster and a demo workload
	$(BIN)/mosaic up --demo

# Two workers (pytest-xdist) for everything but the tests that assert a wall-clock bound (marker
# `serial`), which then run alone so a neighbour's load cannot break the bound they measure.
TEST_WORKERS ?= 2

test: $(STAMP)  ## the whole suite except soak tests (CI runs this)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m 'not slow and not serial'
	$(BIN)/python -m pytest -q -m 'serial and not slow'

test-all: $(STAMP)  ## everything, soak tests included
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m 'not serial' --timeout 3600
	$(BIN)/python -m pytest -q -m 'serial' --timeout 3600

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)  ## the benchmark figures of docs/benchmarks.md
	$(BIN)/python -m libs.sim.bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .mosaic
