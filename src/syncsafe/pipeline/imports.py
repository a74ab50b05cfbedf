"""Which syncsafe modules a file can run: an AST walk of its imports, function-level ones included.

The walk is conservative: an import inside a function counts as much as one at
module level, importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too,
and a module started as a process (``[python, "-m", "syncsafe.x.y", ...]``) is a
dynamic import target, its name written out or held in a module-level string constant
(``ISLAND_MODULE = "syncsafe.diloco.worker"``). It is what dvc.yaml's code deps are computed from and
what the structure tests check them against.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import syncsafe

#: The package's own source folder and the folder above it (``src``).
PACKAGE = Path(syncsafe.__file__).resolve().parent
SRC = PACKAGE.parent


def module_file(name: str) -> Path | None:
    """The source file of module `name` (a package's __init__.py), or None outside the project."""
    if not (name == "syncsafe" or name.startswith("syncsafe.")):
        return None
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path) -> str:
    return ".".join(path.resolve().relative_to(SRC).with_suffix("").parts[:-1]) if path.resolve().is_relative_to(SRC) else ""


def _process_targets(node: ast.AST, constants: dict[str, str]) -> set[str]:
    """`syncsafe...` modules started with `-m` in a list or tuple literal (by name, or by a module-level
    string constant of the file, `constants`)."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return set()
    words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str)
             else constants.get(e.id) if isinstance(e, ast.Name) else None for e in node.elts]
    return {nxt for flag, nxt in zip(words, words[1:]) if flag == "-m" and nxt}


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """The file's module-level `NAME = "..."` assignments."""
    return {node.targets[0].id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


@lru_cache(maxsize=None)
def _imported(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _package_of(path)
    constants = _string_constants(tree)
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
        else:
            found.update(_process_targets(node, constants))
    return frozenset(name for name in found if module_file(name) is not None)


def imported_modules(path: Path) -> set[str]:
    """Every syncsafe module `path` imports (module level or in functions) or starts as a process."""
    return set(_imported(Path(path).resolve()))


def reachable_files(entries: Iterable[Path]) -> set[Path]:
    """Files of every syncsafe module reachable from `entries` (the entries and parent packages' __init__ included)."""
    seen: set[Path] = set()
    todo = [Path(e).resolve() for e in entries]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.is_relative_to(PACKAGE):  # a module runs its packages' __init__ first
            todo += [p / "__init__.py" for p in path.parents if p.is_relative_to(PACKAGE) and (p / "__init__.py").is_file()]
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                file = module_file(".".join(parts[:i]))
                if file is not None and file not in seen:
                    todo.append(file)
    return {p for p in seen if p.is_relative_to(PACKAGE)}


def subpackage(path: Path) -> str:
    """The first-level part of the package `path` belongs to (`analysis`, ...; a top module: its stem)."""
    rel = Path(path).resolve().relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def subpackage_edges() -> dict[str, set[str]]:
    """subpackage -> the other subpackages its modules import."""
    edges: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        here = subpackage(path)
        for name in imported_modules(path):
            there = subpackage(module_file(name))
            if there not in (here, "__init__"):
                edges.setdefault(here, set()).add(there)
    return edges


def import_cycles() -> list[tuple[str, str]]:
    """Pairs of subpackages that reach each other through imports (directly or through others)."""
    edges = subpackage_edges()

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in edges.get(start, ()))

    return sorted({tuple(sorted((a, b))) for a, targets in edges.items() for b in targets if reaches(b, a, {b})})
