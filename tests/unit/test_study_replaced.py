"""A study removes its earlier experiments only once every point of the new run is queued: a queue command that
fails leaves the earlier experiments as they were, and nothing of the new run queued."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from syncsafe.studies import run as study_run
from syncsafe.studies.replaced import ASIDE, replacing
from syncsafe.studies.spec import load_study

REPO = Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A git repository holding the shipped params and studies, with one commit."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(REPO / "studies", tmp_path / "studies")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return tmp_path


def _experiment(root: Path, name: str) -> str:
    """An experiment ref as DVC writes one (refs/exps/<baseline[:2]>/<baseline[2:]>/<name>); its ref."""
    head = _git(root, "rev-parse", "HEAD")
    ref = f"refs/exps/{head[:2]}/{head[2:]}/{name}"
    _git(root, "update-ref", ref, head)
    return ref


def _refs(root: Path) -> list[str]:
    return sorted(_git(root, "for-each-ref", "--format=%(refname)").split())


def test_a_failed_queue_keeps_the_earlier_experiments_and_queues_nothing(project: Path, monkeypatch):
    study = load_study(project, "ablation")
    names = [study.experiment(p) for p in study.distinct()]
    earlier = [_experiment(project, n) for n in names]
    before = _refs(project)
    calls: list[tuple[str, ...]] = []

    def fake_dvc(root, *args, env=None):
        calls.append(args)
        if args[:2] == ("exp", "remove"):  # what DVC would do to a finished experiment: its ref goes
            for name in args[2:]:
                subprocess.run(["git", "update-ref", "-d", next(r for r in earlier if r.endswith("/" + name))],
                               cwd=root, check=True)
        queued = sum(1 for c in calls if c[:3] == ("exp", "run", "--queue"))
        failed = args[:3] == ("exp", "run", "--queue") and queued == 2  # the second point cannot be queued
        return subprocess.CompletedProcess(args, 1 if failed else 0, "", "bad point" if failed else "")

    monkeypatch.setattr(study_run, "dvc", fake_dvc)
    monkeypatch.setattr(study_run, "untracked_code", lambda root: [])
    with pytest.raises(study_run.StudyFailed, match="bad point"):
        study_run.run_study(project, study, echo=lambda line: None)
    assert _refs(project) == before  # the earlier experiments are all there, nothing set aside is left
    assert calls[-1] == ("queue", "remove", *names)  # the point queued before the failure is taken off the queue
    assert not any(c[:2] == ("exp", "remove") for c in calls)


def test_replacing_deletes_the_earlier_refs_once_the_body_returns_and_restores_them_when_it_raises(project: Path):
    kept = _experiment(project, "study.a")
    other = _experiment(project, "study.other")
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with replacing(project, ["study.a", "study.new"], lines.append) as old:
            assert old == ["study.a"]
            assert kept not in _refs(project) and other in _refs(project)  # DVC no longer sees it: no conflict
            raise KeyboardInterrupt
    assert kept in _refs(project) and not any(r.startswith(ASIDE) for r in _refs(project))
    assert "kept the earlier experiment(s) study.a" in lines[-1]
    with replacing(project, ["study.a"], lines.append):
        pass
    assert kept not in _refs(project) and other in _refs(project)
    assert not any(r.startswith(ASIDE) for r in _refs(project)) and lines[-1] == "replaced 1 earlier experiment(s): study.a"
