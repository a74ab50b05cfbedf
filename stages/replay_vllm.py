"""DVC stage `replay-vllm`: the configured subset of schedules against a real vLLM server."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["replay", "run", "--backend", "vllm", *sys.argv[1:]], prog_name="stages/replay_vllm.py")
