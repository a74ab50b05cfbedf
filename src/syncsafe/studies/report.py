"""`syncsafe study report NAME`: every point's results, read from its DVC experiment, judged as one family.

Nothing is rerun: each point's `reports/envelope.csv` and `reports/policy_table.csv` are read from its
experiment's commit through DVC (`dvc.api.open`, from the local cache). The study's files go to
`reports/studies/<name>/`: `table.csv` (one row per point and regime: the mean and interval over seeds, the
point's own tier, the study's test, its Holm-adjusted p and whether it is a finding), `seeds.csv` (the per
seed values behind it), `figure.png` and `report.md`; each point's run in MLflow gets the same numbers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from syncsafe.analysis.report import markdown_table
from syncsafe.artifacts import layout
from syncsafe.artifacts.layout import study_dir
from syncsafe.config import load_params, parse_params, policy_label, read_yaml
from syncsafe.errors import BadInput
from syncsafe.io import write_csv, write_text
from syncsafe.studies.family import PointResult, judge, mean_ci, seed_table
from syncsafe.studies.figure import save_study_figure
from syncsafe.studies.run import experiment_name, experiment_refs
from syncsafe.studies.dvc_overrides import first_difference
from syncsafe.studies.spec import Point, Study, point_params
from syncsafe.tracking.settings import tracking_enabled, tracking_uri
from syncsafe.tracking.studies import PointRecord, log_study_points

ENVELOPE = layout.report_rel(layout.ENVELOPE_FILE).as_posix()
POLICY_TABLE = layout.report_rel(layout.POLICY_TABLE_FILE).as_posix()


def read_at(root: Path, rel: str, rev: str, what: str) -> pd.DataFrame:
    """A CSV output of the pipeline as the commit `rev` (an experiment's) recorded it."""
    import dvc.api

    try:
        with dvc.api.open(rel, repo=str(root), rev=rev) as fh:
            return pd.read_csv(fh)
    except Exception as err:  # noqa: BLE001 - DVC raises many kinds; one line naming what is missing
        raise BadInput(f"{what}: cannot read {rel} at {rev[:12]}: {type(err).__name__}: {err}") from None


def collect(root: Path, study: Study) -> list[PointResult]:
    refs = experiment_refs(root)
    missing = [study.experiment(p) for p in study.points if study.experiment(p) not in refs]
    if missing:
        raise BadInput(f"study {study.name}: no DVC experiment {', '.join(missing)}; "
                       f"run `syncsafe study run {study.name}` first")
    results = []
    for point in study.points:
        sha, what = refs[study.experiment(point)], f"point {point.name}"
        check_ran_its_params(root, study, point, sha)
        results.append(PointResult(point=point, envelope=read_at(root, ENVELOPE, sha, what),
                                   policy_table=read_at(root, POLICY_TABLE, sha, what)))
    return results


def check_ran_its_params(root: Path, study: Study, point: Point, sha: str) -> None:
    """Refuse an experiment whose params.yaml is not the point's (an older run, another study's, a hand edit)."""
    done = subprocess.run(["git", "show", f"{sha}:params.yaml"], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise BadInput(f"point {point.name}: experiment {study.experiment(point)} ({sha[:12]}) has no params.yaml")
    where = f"params.yaml of experiment {study.experiment(point)}"
    ran = parse_params(read_yaml(done.stdout, where), where).model_dump(mode="json")
    differs = first_difference(point_params(study, point).model_dump(mode="json"), ran)
    if differs:
        key, want, got = differs
        raise BadInput(f"point {point.name}: experiment {study.experiment(point)} ran with {key} = {got!r}, the "
                       f"point means {want!r}; run `syncsafe study run {study.name}` again")


def summary(seeds: pd.DataFrame, point: str) -> pd.DataFrame:
    """Per (regime, policy) of one point: mean and interval over seeds of gap closed and SLO violations."""
    rows = []
    here = seeds[seeds["point"] == point]
    for (regime, policy), group in here.groupby(["regime", "policy"], sort=True):
        rows.append({"regime": regime, "policy": policy, **mean_ci(group["gap_closed"], "gap_closed"),
                     **mean_ci(group["slo_pct"], "slo_pct")})
    return pd.DataFrame(rows)


def write_study_report(root: Path, study: Study) -> Path:
    """Judge the study's points and write reports/studies/<name>/; log each point's run to MLflow."""
    alpha = load_params(root / "params.yaml").analysis.alpha
    results = collect(root, study)
    seeds = seed_table(study, results)
    rows = judge(study, results, alpha)
    out = study_dir(root, study.name)
    write_csv(out / layout.STUDY_TABLE_FILE, rows)
    write_csv(out / layout.STUDY_SEEDS_FILE, seeds)
    save_study_figure(seeds, rows, f"study {study.name}: {study.spec.question}", out / layout.STUDY_FIGURE_FILE)
    run_record = _run_record(out, study)
    write_text(out / layout.REPORT_FILE, render(study, rows, alpha, run_record))
    if tracking_enabled():
        records = [PointRecord(point=r.point.name, order=i, pipeline_run_id=f"dvc-exp-{study.experiment(r.point)}",
                               overrides=study.overrides(r.point), summary=summary(seeds, r.point.name),
                               seeds=seeds[seeds["point"] == r.point.name].reset_index(drop=True))
                   for i, r in enumerate(results)]
        log_study_points(tracking_uri(root), experiment_name(study.name), study.name, records)
    return out


def _run_record(out: Path, study: Study) -> dict[str, Any] | None:
    """What `study run` (or the DAG's point tasks) recorded: per point the stages run and reused; the wall time."""
    points = [json.loads(path.read_text(encoding="utf-8"))
              for path in (out / layout.STUDY_POINTS_DIR / f"{p.slug}.json" for p in study.points) if path.is_file()]
    if not points:
        return None
    run = out / layout.RUN_FILE
    wall = json.loads(run.read_text(encoding="utf-8"))["wall_s"] if run.is_file() else None
    return {"wall_s": wall, "points": points}


def render(study: Study, rows: pd.DataFrame, alpha: float, run: dict[str, Any] | None) -> str:
    spec = study.spec
    mode = "full (trained schedules, real replays as params say)" if study.full else "cheap (the study's `cheap` overrides)"
    lines = [f"# Study `{study.name}`: {spec.question}", "", spec.description.strip(), "",
             f"Mode: {mode}. {len(study.points)} points, each a DVC experiment `{study.name}.<point>` (checked to "
             f"have run the point's params); every point "
             f"is judged by the protocol on its own (the tier column). The study's own question is one Holm family "
             f"over all {len(rows)} (point, regime) tests at alpha {alpha:g}: a finding is a Holm-adjusted p below it.",
             ""]
    if spec.question == "ablation":
        lines += ["Question per point: does removing the term make the policy worse? Per seed, each policy's rank "
                  "among its own matched-random draws (0 best); exact sign test that the full policy ranks lower on "
                  "more seeds (ties dropped). `Δ vs MR` is the ablation's sync-excess minus its matched random, "
                  "minus the same for the full policy (pp; positive: the ablation is worse).", ""]
        header = ["ablation", "regime", "full better / ablation better (seeds)", "Δ vs MR diff (pp) [95 % CI]",
                  "p", "p Holm", "finding", "tier full → ablation"]
        body = [[policy_label(r.value), r.regime, f"{r.seeds_full_better} / {r.seeds_ablation_better} of {r.n_seeds}",
                 f"{r.delta_diff_pct_mean:+.3g} [{r.delta_diff_pct_ci_low:.3g}, {r.delta_diff_pct_ci_high:.3g}]",
                 f"{r.p:.3g}", f"{r.p_holm:.3g}", "yes" if r.finding else "no", f"{r.reference_tier} → {r.tier}"]
                for r in rows.itertuples()]
    else:
        lines += [f"Question per point: does `{study.policy}` still beat its matched random? The point's own rank "
                  "test p (before the point's own adjustment), Holm across the study.", ""]
        header = ["point", "regime", "gap closed [95 % CI] (seeds)", "SLO % [95 % CI]", "p", "p Holm", "finding",
                  "tier"]
        body = [[r.point, r.regime,
                 f"{r.gap_closed_mean:.3g} [{r.gap_closed_ci_low:.3g}, {r.gap_closed_ci_high:.3g}] ({r.gap_closed_seeds})",
                 f"{r.slo_pct_mean:.3g} [{r.slo_pct_ci_low:.3g}, {r.slo_pct_ci_high:.3g}]",
                 f"{r.p:.3g}", f"{r.p_holm:.3g}", "yes" if r.finding else "no", r.tier] for r in rows.itertuples()]
    lines += [markdown_table(header, body), "", f"![study figure]({layout.STUDY_FIGURE_FILE})", ""]
    if run:
        wall = f"Wall time of the queue {run['wall_s']:.0f} s. " if run["wall_s"] is not None else ""
        lines += [f"## The run\n\n{wall}Stages per point: run, or reused from DVC's cache because the point "
                  "changes none of their deps or params.", ""]
        lines.append(markdown_table(["point", "ran", "reused"],
                                    [[p["point"], len(p["ran"]), ", ".join(p["reused"]) or "-"] for p in run["points"]]))
        lines.append("")
    return "\n".join(lines)
