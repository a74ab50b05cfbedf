# The two commands: `make run` (set up, then run the pipeline on the CPU
# defaults) and `make test`. Both create the virtual environment if needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU profile uses the CPU build of torch that pip finds for this pin.
TORCH  ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup run test test-fast bench clean

$(BIN)/syncsafe: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/syncsafe

run: setup
	dvc repro
	syncsafe schedules

test: setup
	pytest

test-fast: setup
	pytest -m "not slow"

bench: setup
	python benchmarks/bench_controller.py

clean:
	rm -rf data runs reports models
