"""DVC stage `replay-simulator` (dvc.yaml, generated from syncsafe.pipeline.declarations): python stages/replay_simulator.py [--regime R]."""

from syncsafe.pipeline.runner import main

if __name__ == "__main__":  # spawned worker processes re-import this module
    main("replay-simulator")
