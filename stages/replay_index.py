"""DVC stage `replay-index`: joins the replay sets into runs/replay/index.csv."""

import sys

from syncsafe.cli import app

app(["replay", "index", *sys.argv[1:]], prog_name="stages/replay_index.py")
