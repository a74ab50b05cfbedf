"""DVC stage `analyze`: the evidence protocol on the pipeline's replays, into reports/."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["analyze", *sys.argv[1:]], prog_name="stages/analyze.py")
