"""DVC stage `traces@<regime>`: python stages/traces.py --regime REGIME."""

import sys

from syncsafe.cli import app

app(["traces", *sys.argv[1:]], prog_name="stages/traces.py")
