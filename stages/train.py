"""DVC stage `train@<regime>`: python stages/train.py --regime REGIME."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["train", *sys.argv[1:]], prog_name="stages/train.py")
