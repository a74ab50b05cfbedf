"""DVC stage `profile-vllm` (dvc.yaml, generated from syncsafe.pipeline.declarations): python stages/profile_vllm.py."""

from syncsafe.pipeline.runner import main

if __name__ == "__main__":  # spawned worker processes re-import this module
    main("profile-vllm")
