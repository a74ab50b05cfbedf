"""One module per pipeline stage: its entry function `run(params, root, regime, params_path, **options) -> str`.

Each does the stage's work through the library and returns the summary line(s)
to print. Nothing here imports another stage's code, so a stage's import
closure (and its dvc.yaml code deps) holds only what it runs. Stage-specific
options of the `syncsafe` commands (train --policy/--seed/--resume, live
--policy/--seed, analyze --alpha) are keyword arguments with defaults.
"""
