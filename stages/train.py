"""DVC stage `train@<regime>`: python stages/train.py --regime REGIME."""

import sys

from syncsafe.cli import app

app(["train", *sys.argv[1:]], prog_name="stages/train.py")
