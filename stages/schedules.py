"""DVC stage `schedules@<regime>`: python stages/schedules.py --regime REGIME."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["schedules", "build", *sys.argv[1:]], prog_name="stages/schedules.py")
