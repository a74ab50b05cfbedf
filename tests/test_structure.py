"""The package's structure: one-way imports between subpackages, DVC deps that cover what a stage runs."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "syncsafe"


def module_file(name: str) -> Path | None:
    """The source file of module `name` (a package's __init__.py), or None outside the project."""
    if not (name == "syncsafe" or name.startswith("syncsafe.")):
        return None
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every syncsafe module `path` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(SRC).with_suffix("").parts[:-1]) if path.is_relative_to(SRC) else ""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {name for name in found if module_file(name) is not None}


def reachable_files(entry: Path) -> set[Path]:
    """Files of every syncsafe module reachable from `entry` (parent packages' __init__ included)."""
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                file = module_file(".".join(parts[:i]))
                if file is not None and file not in seen:
                    todo.append(file)
    return {p for p in seen if p.is_relative_to(PACKAGE)}


def subpackage(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_no_import_cycle_between_subpackages():
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = subpackage(path)
        for name in imported_modules(path):
            there = subpackage(module_file(name))
            if there not in (here, "__init__"):
                edges.setdefault(here, set()).add(there)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in edges.get(start, ()))

    cycles = sorted({tuple(sorted((a, b))) for a, targets in edges.items() for b in targets if reaches(b, a, {b})})
    assert not cycles, f"subpackages import each other (directly or through others): {cycles}"


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(ROOT)
    return any(rel == Path(dep) or Path(dep) in rel.parents for dep in deps)


def stage_entries() -> list[tuple[str, Path, list[str]]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        script = next(word for word in body["cmd"].split() if word.startswith("stages/"))
        out.append((name, ROOT / script, [str(dep).split()[0] for dep in body.get("deps", [])]))
    return out


def test_every_stage_depends_on_all_the_code_it_runs():
    missing = {}
    for name, script, deps in stage_entries():
        assert covered(script, deps), f"stage {name}: its own entry {script.name} is not a dep"
        gaps = sorted(str(p.relative_to(ROOT)) for p in reachable_files(script) if not covered(p, deps))
        if gaps:
            missing[name] = gaps
    assert not missing, f"dvc.yaml deps miss modules the stage imports: {missing}"


def test_the_dependency_walk_sees_function_level_imports():
    entry = PACKAGE / "cli.py"
    files = {str(p.relative_to(PACKAGE)) for p in reachable_files(entry)}
    # cli.py imports the analysis only inside the analyze command
    assert "analysis/protocol.py" in files and "config/__init__.py" in files and "config/sections.py" in files


def test_every_dvc_param_key_is_spelled_out_in_params_yaml():
    """DVC reads params from params.yaml itself: a key left to a schema default makes `dvc repro` fail."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    missing = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        regimes = list(params["regimes"]) if "foreach" in stage else [None]
        for key in body.get("params", []):
            for regime in regimes:
                node = params
                for part in key.replace("${key}", str(regime)).split("."):
                    if not isinstance(node, dict) or part not in node:
                        missing.append((name, key))
                        break
                    node = node[part]
    assert not missing, f"dvc.yaml params not in params.yaml: {sorted(set(missing))}"
