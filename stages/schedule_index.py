"""DVC stage `schedule-index`: joins the per-regime schedule indexes."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["schedules", "index", *sys.argv[1:]], prog_name="stages/schedule_index.py")
