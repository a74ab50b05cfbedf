#!/usr/bin/env bash
# Test hosts on one machine: network namespaces joined by veth pairs on a bridge (root only).
#   scripts/fleet.sh up [--hosts N] | down | status | shape HOST --rate-mbit R [--delay-ms D] | cut HOST | restore HOST
# See README, "Several hosts on one machine".
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$repo/.venv/bin/python" -m syncsafe.fleet "$@"
