"""DVC stage `calibrate`: fit the simulator to the vLLM replays; effect-size transfer and held-out fidelity."""

import sys

from syncsafe.cli import app

app(["calibrate", *sys.argv[1:]], prog_name="stages/calibrate.py")
