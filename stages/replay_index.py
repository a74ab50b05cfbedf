"""DVC stage `replay-index` (dvc.yaml, generated from syncsafe.pipeline.declarations): python stages/replay_index.py."""

from syncsafe.pipeline.runner import main

if __name__ == "__main__":  # spawned worker processes re-import this module
    main("replay-index")
