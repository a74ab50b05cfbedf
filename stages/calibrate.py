"""DVC stage `calibrate`: fit the simulator to the vLLM replays; effect-size transfer and held-out fidelity."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["calibrate", *sys.argv[1:]], prog_name="stages/calibrate.py")
