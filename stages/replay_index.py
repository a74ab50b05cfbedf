"""DVC stage `replay-index`: joins the replay sets into runs/replay/index.csv."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["replay", "index", *sys.argv[1:]], prog_name="stages/replay_index.py")
