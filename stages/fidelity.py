"""DVC stage `fidelity`: the simulator judged on the held-out seeds' real vLLM replays."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["fidelity", *sys.argv[1:]], prog_name="stages/fidelity.py")
