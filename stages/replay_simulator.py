"""DVC stage `replay-simulator@<regime>`: python stages/replay_simulator.py --regime REGIME."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["replay", "run", "--backend", "simulator", *sys.argv[1:]], prog_name="stages/replay_simulator.py")
