"""DVC stage `traces@<regime>`: python stages/traces.py --regime REGIME."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["traces", *sys.argv[1:]], prog_name="stages/traces.py")
