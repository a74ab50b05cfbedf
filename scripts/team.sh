#!/usr/bin/env bash
# The team setup on one machine: PostgreSQL, Redis, an MLflow server and Airflow with the
# CeleryExecutor (two workers, one on the gpu queue), all on 127.0.0.1; or, with
# `up --fleet NAME [--hosts N]`, spread over the hosts of a fleet (scripts/fleet.sh): services on
# host a (its address only), the gpu worker on b, the cpu worker on c (else a).
#   scripts/team.sh up [--fleet NAME [--hosts N]] | down | status [--env] | trigger DAG_ID [--conf JSON] [--wait]
# Needs `make team-env`. See README, "The team setup on one machine".
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# this checkout's code, also where .venv was installed from another one
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$repo/.venv/bin/python" -m syncsafe.team "$@"
