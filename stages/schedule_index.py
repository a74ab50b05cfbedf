"""DVC stage `schedule-index`: joins the per-regime schedule indexes."""

import sys

from syncsafe.cli import app

app(["schedules", "index", *sys.argv[1:]], prog_name="stages/schedule_index.py")
