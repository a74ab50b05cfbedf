"""DVC stage `traces` (dvc.yaml, generated from syncsafe.pipeline.declarations): python stages/traces.py [--regime R]."""

from syncsafe.pipeline.runner import main

if __name__ == "__main__":  # spawned worker processes re-import this module
    main("traces")
