"""Earlier experiments of a study kept until their replacements are queued (or, for one point, have run).

A study's points are DVC experiments named `<study>.<point>`; DVC refuses to queue a name that exists (unless
forced, which would also rerun every stage instead of reusing the run cache). So the earlier experiments must
go before their replacements are queued, and removing them first lost a study's results whenever queueing
then failed. Here they are set aside instead: each experiment's git ref (`refs/exps/<baseline>/<name>`) moves
to `refs/syncsafe-replaced/...`, where DVC does not look; when the replacements are queued the set-aside refs
are deleted (what `dvc exp remove` does to a finished experiment), and when anything fails they are put back.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

#: Where DVC keeps experiment refs, and where a replaced one waits.
EXPS = "refs/exps/"
ASIDE = "refs/syncsafe-replaced/"


class RefError(RuntimeError):
    """A git ref could not be read, moved or deleted."""


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise RefError(f"git {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def experiment_ref_names(root: Path) -> dict[str, tuple[str, str]]:
    """DVC's experiments: name -> (full ref, commit)."""
    found = {}
    for line in _git(root, "for-each-ref", EXPS, "--format=%(refname) %(objectname)").splitlines():
        ref, _, sha = line.partition(" ")
        if ref.count("/") >= 4:  # refs/exps/<baseline[:2]>/<baseline[2:]>/<name>
            found[ref.rsplit("/", 1)[1]] = (ref, sha)
    return found


def _move(root: Path, moves: list[tuple[str, str, str]]) -> None:
    """Each (source, destination, commit): destination set to commit, then source deleted."""
    for source, dest, sha in moves:
        _git(root, "update-ref", dest, sha)
        _git(root, "update-ref", "-d", source, sha)


@contextlib.contextmanager
def replacing(root: Path, names: list[str], echo: Callable[[str], None]) -> Iterator[list[str]]:
    """The earlier experiments among `names` set aside while the body queues (or runs) their replacements;
    deleted when the body returns, put back (replacing whatever the body made under their names) when it raises.
    Yields the names set aside."""
    refs = experiment_ref_names(root)
    old = sorted(n for n in set(names) if n in refs)
    aside = [(refs[n][0], ASIDE + refs[n][0].removeprefix(EXPS), refs[n][1]) for n in old]
    _move(root, aside)
    try:
        yield old
    except BaseException:
        _move(root, [(dest, source, sha) for source, dest, sha in aside])
        if old:
            echo(f"kept the earlier experiment(s) {', '.join(old)}: their replacements did not get through")
        raise
    for _, dest, sha in aside:
        _git(root, "update-ref", "-d", dest, sha)
    if old:
        echo(f"replaced {len(old)} earlier experiment(s): {', '.join(old)}")
