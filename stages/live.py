"""DVC stage `live`: the controller as a sidecar beside a real vLLM server (off unless live.enabled)."""

import sys

from syncsafe.cli import app

if __name__ == "__main__":  # spawned worker processes re-import this module
    app(["live", "--stage", *sys.argv[1:]], prog_name="stages/live.py")
