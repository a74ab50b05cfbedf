"""The vLLM environment the real-server tests need (`make vllm-env`, which `make test` runs)."""

from pathlib import Path

import pytest

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def require_vllm_python() -> Path:
    """The vLLM environment's python; fail (never skip) the test when it is missing."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} missing: run `make vllm-env` (make test does)")
    return VLLM_PYTHON


#: Served eagerly in the tests that check replay, lifetime and placement rather than the server's speed: the
#: graph capture of the tiny model costs 20-30 s of every server start (it buys a faster token: measured by
#: `benchmarks/bench_vllm_start.py`). `dvc repro` in a fresh copy keeps the shipped server_args, capture included.
EAGER = "--enforce-eager"


def eager(raw: dict) -> dict:
    """`raw` params with the vLLM server started eagerly (see `EAGER`)."""
    vllm = raw["replay"]["vllm"]
    vllm["server_args"] = [*vllm.get("server_args", []), EAGER]
    return raw
