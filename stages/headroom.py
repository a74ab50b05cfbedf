"""DVC stage `headroom` (dvc.yaml, generated from syncsafe.pipeline.declarations): python stages/headroom.py [--regime R]."""

from syncsafe.pipeline.runner import main

if __name__ == "__main__":  # spawned worker processes re-import this module
    main("headroom")
