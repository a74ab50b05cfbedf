"""The vLLM environment the real-server tests need (`make vllm-env`, which `make test` runs)."""

from pathlib import Path

import pytest

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def require_vllm_python() -> Path:
    """The vLLM environment's python; fail (never skip) the test when it is missing."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} missing: run `make vllm-env` (make test does)")
    return VLLM_PYTHON
