"""The package's structure: one-way imports between subpackages; dvc.yaml and the nightly DAG's order
generated from the stage declarations, with code deps that cover what each stage can import."""

from __future__ import annotations

from pathlib import Path

import yaml

from syncsafe.pipeline import dvc_yaml
from syncsafe.pipeline.declarations import STAGES, stage, topological_order
from syncsafe.pipeline.imports import PACKAGE, import_cycles, reachable_files

ROOT = Path(__file__).resolve().parents[2]


def _committed_stages() -> dict[str, dict]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    return {name: body.get("do", body) for name, body in stages.items()}


def test_no_import_cycle_between_subpackages():
    assert import_cycles() == [], "subpackages import each other (directly or through others)"


def test_committed_dvc_yaml_and_dag_order_are_the_render_of_the_declarations():
    assert dvc_yaml.differences(ROOT) == [], "run `syncsafe dvc-yaml` and commit dvc.yaml and dags/syncsafe_stages.json"
    assert list(_committed_stages()) == [s.name for s in STAGES]


def test_every_stage_depends_on_all_the_code_it_runs():
    """Checked on the committed file: the script, the runner and the entry's whole import closure."""
    missing = {name: gaps for name, body in _committed_stages().items()
               if (gaps := dvc_yaml.uncovered(stage(name), body["deps"], ROOT))}
    assert not missing, f"dvc.yaml deps miss modules the stage imports: {missing}"


def test_the_check_names_a_module_dropped_from_a_stage_s_deps():
    spec = stage("train")
    deps = dvc_yaml.stage_body(spec, ROOT)["deps"]
    assert dvc_yaml.uncovered(spec, deps, ROOT) == []
    dropped = "src/syncsafe/procs.py"  # imported by diloco (islands as processes)
    assert dropped in deps
    assert dvc_yaml.uncovered(spec, [d for d in deps if d != dropped], ROOT) == [dropped]
    # a whole subpackage dropped: every one of its modules is named
    gaps = dvc_yaml.uncovered(spec, [d for d in deps if d != "src/syncsafe/diloco"], ROOT)
    assert "src/syncsafe/diloco/worker.py" in gaps and "src/syncsafe/diloco/launch.py" in gaps
    assert all(g.startswith("src/syncsafe/diloco/") for g in gaps)
    assert dvc_yaml.uncovered(spec, deps[1:], ROOT) == [spec.script]  # the stage's own script


def test_the_dependency_walk_sees_function_level_imports_and_module_processes():
    files = {str(p.relative_to(PACKAGE)) for p in reachable_files([PACKAGE / "cli" / "__init__.py"])}
    # the command imports the analysis only inside the analyze command, the tuning inside tune
    assert "cli/tuning.py" in files and "cli/studies.py" in files and "tuning/search.py" in files
    assert "analysis/protocol.py" in files and "config/__init__.py" in files and "config/sections.py" in files
    # training starts `python -m syncsafe.diloco.worker` processes; live its island processes
    train = {str(p.relative_to(PACKAGE)) for p in dvc_yaml.code_files(stage("train"), ROOT)}
    assert "diloco/worker.py" in train
    # the launcher names the worker through a constant and imports nothing of it: the islands' code (the
    # controller, the outer step) is reached through the process alone
    assert {"control/controller.py", "diloco/outer.py", "diloco/islands.py"} <= train
    live = {str(p.relative_to(PACKAGE)) for p in dvc_yaml.code_files(stage("live"), ROOT)}
    assert "live/islands.py" in live


def test_a_stage_runs_its_own_code_not_the_whole_package():
    closures = {s.name: {str(p.relative_to(PACKAGE)) for p in dvc_yaml.code_files(s, ROOT)} for s in STAGES}
    everything = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    for name, files in closures.items():
        assert not any(f.startswith("cli/") for f in files), name
        assert files < everything, name
        others = {f"pipeline/entries/{s.module.rsplit('.', 1)[1]}.py" for s in STAGES if s.name != name}
        assert not files & others, f"{name} imports other stages' entries: {files & others}"
    assert not any(f.startswith(("analysis/", "serving/", "realarm/", "live/")) for f in closures["train"])
    assert not any(f.startswith(("analysis/", "diloco/", "serving/")) for f in closures["traces"])


def test_serving_is_below_the_real_arm_and_the_live_sidecar():
    """serving/ (server, load generator, metrics, simulator) imports neither the real arm, nor the live
    sidecar, nor training; the real arm imports no live sidecar."""
    closure = lambda pkg: {str(p.relative_to(PACKAGE)) for p in reachable_files(sorted((PACKAGE / pkg).glob("*.py")))}  # noqa: E731
    assert not {f for f in closure("serving") if f.startswith(("realarm/", "live/", "diloco/"))}
    assert not {f for f in closure("realarm") if f.startswith("live/")}
    assert "realarm/arm.py" in closure("live")  # the walk does follow the sidecar into the real arm


def test_stage_order_follows_the_declared_inputs_and_outputs():
    order = topological_order()
    assert order[0] == "traces" and order[-1] == "analyze"
    pos = {name: i for i, name in enumerate(order)}
    # the calibration loop: real replays -> fit -> simulator replays on the fit -> fidelity
    assert pos["replay-vllm"] < pos["calibrate-fit"] < pos["replay-simulator"] < pos["fidelity"]
    assert pos["train"] < pos["schedules"] < pos["schedule-index"] < pos["replay-vllm"]


def test_every_dvc_param_key_is_spelled_out_in_params_yaml():
    """DVC reads params from params.yaml itself: a key left to a schema default makes `dvc repro` fail."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    missing = []
    for name, stage_ in stages.items():
        body = stage_.get("do", stage_)
        regimes = list(params["regimes"]) if "foreach" in stage_ else [None]
        for key in body.get("params", []):
            for regime in regimes:
                node = params
                for part in key.replace("${key}", str(regime)).split("."):
                    if not isinstance(node, dict) or part not in node:
                        missing.append((name, key))
                        break
                    node = node[part]
    assert not missing, f"dvc.yaml params not in params.yaml: {sorted(set(missing))}"


def test_every_test_module_has_a_basename_of_its_own():
    # pytest imports test modules by basename (no packages under tests/): two files with one name
    # stop the whole collection with "import file mismatch".
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert clashes == []
