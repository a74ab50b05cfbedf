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
#: graph capture of the tiny model costs 20-30 s of every server start (what it buys per request varied from
#: 2 % to 46 % between runs of `benchmarks/bench_vllm_start.py`). `dvc repro` in a fresh copy keeps the shipped
#: server_args, capture included.
EAGER = "--enforce-eager"


def eager(raw: dict) -> dict:
    """`raw` params with the vLLM server started eagerly (see `EAGER`): its server_args (the defaults where it
    names none) and the flag, once."""
    from syncsafe.config import VllmReplay

    vllm = raw.setdefault("replay", {}).setdefault("vllm", {})
    args = list(vllm.get("server_args", VllmReplay().server_args))
    vllm["server_args"] = args if EAGER in args else [*args, EAGER]
    return raw
