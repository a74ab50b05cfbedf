"""DVC stage `calibrate-fit`: fit the simulator to the server profile and the fit seeds' vLLM replays."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["calibrate-fit", *sys.argv[1:]], prog_name="stages/calibrate_fit.py")
