"""`syncsafe tune` and `syncsafe headroom`: choose a controller's knobs on tuning load, and split the gap.

**tune** scores every point of a policy's knob grid (`tuning.knobs`) on the
tuning seeds of a `TuningSplit` (load the judging never sees) and keeps the
point with the most *pooled* gap closed, sum(random - controller) /
sum(random - oracle) over the tuning seeds (a seed whose gap is small adds
little instead of a noisy ratio; ties: fewer violations, then grid order).
The chosen point and the params' own are then scored on the judged seeds,
the out-of-sample figure. `write_tuned` writes the point as a params
overlay a user can read, merge and commit, with the segments it was chosen
on and the judged ones in its header, and every point's scores beside it.

**headroom** splits, per judged seed, the matched-random -> oracle gap of
a policy's merge count into what decisions on the past alone can buy and
what only knowing the future can: the *online bound* is the point of the
policy's grid with the fewest violations among those that work the same
count on that seed, chosen with hindsight (every point decides on the past
only, so the bound is an online schedule of the same action space and
count; choosing it per seed is what no deployable controller can do). Its
gap closed is the share a better-tuned controller of that family could
reach; one minus it is the share only foresight (or a better family) buys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from tqdm import tqdm

from syncsafe.artifacts import layout
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.io import write_csv, write_text
from syncsafe.tuning.bench import Scored, SeedBench, gap_closed
from syncsafe.tuning.knobs import current, grid, with_knobs
from syncsafe.traces.stage import seed_loads
from syncsafe.tuning.segments import TuningSplit


def pooled_closed(scores: Sequence[Scored]) -> float:
    """sum(random - schedule) / sum(random - oracle) over seeds; NaN when the summed gap is under one request."""
    return gap_closed(sum(s.random_mean for s in scores), sum(s.violations for s in scores),
                      sum(s.oracle for s in scores))


def mean_closed(scores: Sequence[Scored]) -> tuple[float, int]:
    """Mean per-seed gap closed over the seeds that define it, and how many do."""
    values = [s.closed for s in scores if not math.isnan(s.closed)]
    return (float(np.mean(values)) if values else float("nan")), len(values)


@dataclass(frozen=True)
class BenchSettings:
    """How the benches replay: the project root (its calibration and real-arm plan), matched-random draws per
    count (None: params), trace seconds per wall second (None: the real arm's plan, else 1)."""

    root: Path = Path(".")
    draws: int | None = None
    time_scale: float | None = None
    #: Read each seed's load from the traces stage's output under `root` (the pipeline's headroom stage)
    #: instead of generating it from params (the same tables: `traces.stage.seed_loads` writes them).
    from_traces: bool = False

    def benches(self, params: Params, regime: str, seeds: Sequence[int]) -> list[SeedBench]:
        loads = ({s: (read_timeline(self.root, regime, s), read_requests(self.root, regime, s)) for s in seeds}
                 if self.from_traces else seed_loads(params, regime, seeds))
        return [SeedBench.build(params, regime, s, load, self.root, self.draws, self.time_scale)
                for s, load in loads.items()]


def _points(params: Params, policy: str, knobs: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The grid's points, with the params' own point added when the grid lacks it, and that own point."""
    points = grid(policy, list(knobs))
    own = current(params, points[0])
    return (points if own in points else [*points, own]), own


def _summary(scores: Sequence[Scored]) -> dict[str, float]:
    """Pooled and mean gap closed, the seeds defining the mean, and the violations of one point's scores."""
    mean, defined = mean_closed(scores)
    return {"pooled_closed": pooled_closed(scores), "mean_closed": mean, "seeds_defined": defined,
            "violations": sum(s.violations for s in scores)}


def _score_grid(params: Params, policy: str, benches: list[SeedBench], points: list[dict[str, Any]],
                what: str) -> list[list[Scored]]:
    """scores[i][j]: point i on bench j, each against the best oracle found for its count by the end."""
    variants = [with_knobs(params, p) for p in points]
    raw = []
    for variant in tqdm(variants, desc=what, unit="point", leave=False):
        raw.append([b.score(b.controller(variant, policy)) for b in benches])
    return [[b.rescored(s) for b, s in zip(benches, row, strict=True)] for row in raw]


@dataclass(frozen=True)
class TuneResult:
    policy: str
    split: TuningSplit
    chosen: dict[str, Any]
    own: dict[str, Any]
    #: one row per grid point: its knobs, pooled and mean gap closed and violations on the tuning seeds
    trials: pd.DataFrame
    #: chosen and own point on the judged seeds: pooled, mean, seeds defined, violations
    judged: dict[str, dict[str, float]]
    #: keys whose chosen value is an end of its grid (the grid may be too narrow there)
    on_edge: list[str]


def tune(params: Params, policy: str, split: TuningSplit, knobs: Sequence[str] = (),
         bench: BenchSettings = BenchSettings()) -> TuneResult:
    points, own = _points(params, policy, knobs)
    tuning = bench.benches(params, split.regime, split.tuning)
    scores = _score_grid(params, policy, tuning, points, f"tune {policy} {split.regime}")
    rows = [{**point, **_summary(row)} for point, row in zip(points, scores, strict=True)]
    trials = pd.DataFrame(rows)
    order = sorted(range(len(points)), key=lambda i: (-_finite(rows[i]["pooled_closed"]), rows[i]["violations"], i))
    chosen = points[order[0]]
    judged_benches = bench.benches(params, split.regime, split.judged)
    judged_scores = _score_grid(params, policy, judged_benches, [chosen, own], f"judge {policy} {split.regime}")
    judged = {name: {**_summary(row), "seeds": len(row)}
              for name, row in zip(("chosen", "own"), judged_scores, strict=True)}
    axes = {k: sorted({p[k] for p in points}) for k in chosen}
    on_edge = [k for k, values in axes.items() if len(values) > 2 and chosen[k] in (values[0], values[-1])]
    return TuneResult(policy, split, chosen, own, trials, judged, on_edge)


def _finite(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def write_tuned(result: TuneResult, root: Path = Path(".")) -> Path:
    """tuned/<regime>/<policy>.yaml (the chosen point as a params overlay, what it was chosen and judged on in
    its header) and its .trials.csv; returns the YAML's path."""
    split = result.split
    out = layout.tuned_path(root, split.regime, result.policy)
    overlay: dict[str, Any] = {}
    for key, value in result.chosen.items():
        node = overlay
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    j, o = result.judged["chosen"], result.judged["own"]
    header = [
        f"syncsafe tune {result.policy} {split.regime}: the knobs with the most pooled gap closed on the tuning",
        f"load, {split.describe(split.tuning)}; never judged there.",
        f"Judged on {split.describe(split.judged)}:",
        f"  chosen  pooled gap closed {percent(j['pooled_closed'])}, mean {percent(j['mean_closed'])} "
        f"({j['seeds_defined']}/{j['seeds']} seeds define it), {j['violations']:.0f} violations",
        f"  params' own ({_knobs(result.own)}): pooled {percent(o['pooled_closed'])}, mean {percent(o['mean_closed'])} "
        f"({o['seeds_defined']}/{o['seeds']}), {o['violations']:.0f} violations",
        "Simulator replays of the stress harness's schedules; every grid point in the .trials.csv beside this file.",
    ]
    if result.on_edge:
        header.append(f"At the edge of its grid (widen it with --knob): {', '.join(result.on_edge)}")
    text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(overlay, sort_keys=True)
    write_csv(out.with_suffix(".trials.csv"), result.trials)
    return write_text(out, text)


def percent(value: float) -> str:
    """A share as a whole percentage, "undefined" for NaN (a gap under one request)."""
    return "undefined" if math.isnan(value) else f"{100 * value:.0f} %"


def _knobs(point: dict[str, Any]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in point.items())


def headroom(params: Params, policy: str, regime: str, seeds: Sequence[int], knobs: Sequence[str] = (),
             bench: BenchSettings = BenchSettings()) -> pd.DataFrame:
    """Per judged seed: the policy under params, its online bound and the oracle (see the module docstring).

    Columns: seed, n_merges, random, controller, oracle, closed (the params' policy), bound_violations,
    bound_closed, bound_points (grid points that worked the controller's count), bound_knobs.
    """
    points, own = _points(params, policy, knobs)
    benches = bench.benches(params, regime, seeds)
    scores = _score_grid(params, policy, benches, points, f"headroom {policy} {regime}")
    mine = scores[points.index(own)]
    rows = []
    for j, seed_bench in enumerate(benches):
        s = mine[j]
        # the bound works the controller's own count, so that it splits that count's random -> oracle gap
        same = [i for i in range(len(points)) if scores[i][j].n_merges == s.n_merges]
        best = min(same, key=lambda i: (scores[i][j].violations, i))
        b = scores[best][j]
        rows.append({"seed": seed_bench.seed, "n_merges": s.n_merges, "random": s.random_mean, "controller": s.violations,
                     "oracle": s.oracle, "closed": s.closed, "bound_violations": b.violations,
                     "bound_closed": b.closed, "bound_points": len(same), "bound_knobs": _knobs(points[best])})
    return pd.DataFrame(rows)


def headroom_summary(table: pd.DataFrame) -> dict[str, float]:
    """Over the seeds whose gap is defined: mean gap closed of the controller and of its online bound, and the
    share left to foresight (1 - the bound's); and both pooled over every seed (sum(random - schedule) /
    sum(random - oracle): a seed with a small gap weighs little instead of adding a noisy ratio)."""
    defined = table.dropna(subset=["closed"])
    nan = float("nan")
    bound = float(defined["bound_closed"].mean()) if len(defined) else nan
    random, oracle = float(table["random"].sum()), float(table["oracle"].sum())
    return {"seeds": len(table), "seeds_defined": len(defined),
            "controller_closed": float(defined["closed"].mean()) if len(defined) else nan,
            "online_bound_closed": bound, "foresight_share": 1.0 - bound if len(defined) else nan,
            "controller_pooled": gap_closed(random, float(table["controller"].sum()), oracle),
            "online_bound_pooled": gap_closed(random, float(table["bound_violations"].sum()), oracle)}


def describe_headroom(regime: str, policy: str, table: pd.DataFrame) -> str:
    """One line: the policy's gap closed, its online bound and the share left to foresight (`headroom_summary`)."""
    s = headroom_summary(table)
    return (f"{regime} {policy}: gap closed {s['controller_closed']:.0%}, online bound {s['online_bound_closed']:.0%}, "
            f"left to foresight {s['foresight_share']:.0%} ({s['seeds_defined']}/{s['seeds']} seeds define the gap)")

