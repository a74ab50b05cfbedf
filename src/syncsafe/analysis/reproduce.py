"""Does the real arm reproduce? Two runs' real-arm outputs side by side (`syncsafe real-arm compare A B`).

Evidence protocol item 7: two runs of the same commit on the same machine give the same plan and tiers.
This module checks it rather than hoping for it. A and B are project roots; from each it reads (paths
from `syncsafe.artifacts.layout`) the real plan (`runs/replay-sets/vllm/plan.json`), the mechanism gate
(`runs/calibration/mechanism.json`), the held-out fidelity (`runs/fidelity/fidelity.json`), the tiers
(`reports/policy_table.csv`) and the real replays (`runs/replay-sets/vllm/index.csv`), and compares:

1. **plans**: the planned regimes and, per regime, fit and held-out seeds, span, controllers, draws and
   controls equal; time scales within `time_scale_tolerance` of each other (larger / smaller - 1).
2. **tiers**: every (regime, policy) tier of the policy table equal.
3. **gate**: per regime, each run's drift-corrected paired sync ratio (`gate_ratio`) inside the other
   run's 95 % bounds (a missing bound is unbounded on its side).
4. **fidelity**: per regime (the pooled figures where a run has none of the regime), the held-out p95
   error, SLO-rate error and paired sync ratio sim/real of both, their 95 % bounds under the server's
   replay-to-replay wander, and each one's outcome (met, missed, undecided); it fails when the outcomes
   differ unless both carry bounds, each value lies inside the other's and no target is met in one run
   and missed in the other.
5. **real vs random**: per regime, the primary controller (the plan's first) minus the mean of its
   span-matched draws on each seed's valid real replays, for the SLO violation rate (pp) and the p95
   (ms); the mean over seeds with its t 95 % interval (`scipy.stats.t`; unbounded with fewer than two
   seeds). Each run's mean must lie inside the other's interval.

A missing or malformed input is `BadInput` (the artifact readers' `ArtifactMissing` / `ArtifactMalformed`,
exit 2) naming the file; `Reproduction.failures` holds one line per check that does not reproduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

from syncsafe.analysis.evidence import (
    FIDELITY_FIGURES,
    FidelityEvidence,
    FidelityOutcome,
    MechanismEvidence,
    RegimeFidelity,
    fidelity_outcome,
    target_text,
)
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import require_file
from syncsafe.artifacts.calibration import read_fidelity, read_mechanism, read_vllm_plan
from syncsafe.artifacts.layout import PathLike
from syncsafe.artifacts.replay_sets import INDEX_COLUMNS, read_vllm_index
from syncsafe.artifacts.reports import read_policy_table
from syncsafe.realarm.design import RealPlan, RegimePlan

#: Time scales of the two plans may differ by this share (larger / smaller - 1).
DEFAULT_TIME_SCALE_TOLERANCE = 0.10
CONFIDENCE = 0.95
#: Relative slack of an interval test (floating-point noise is no difference).
_EPS = 1e-9
#: The plan fields that must be equal, per regime.
PLAN_FIELDS = ("fit_seeds", "held_out_seeds", "span_s", "controllers", "draws", "controls")
DRAW_POLICY = "matched_random"


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class RealArmOutputs:
    """One run's real-arm outputs, read from its project root."""

    root: Path
    plan: RealPlan
    mechanism: MechanismEvidence
    fidelity: FidelityEvidence
    policy_table: pd.DataFrame
    index: pd.DataFrame


def _required(root: Path, rel: Path, what: str, hint: str) -> None:
    require_file(layout.at(root, rel), what, hint)


def load_outputs(root: PathLike) -> RealArmOutputs:
    """Every real-arm output under `root`; BadInput naming the first file that is missing or malformed."""
    root = Path(root)
    _required(root, layout.VLLM_PLAN, "real-arm plan", "run the replay-vllm stage")
    _required(root, layout.MECHANISM, "mechanism evidence file", "run the calibrate-fit stage")
    _required(root, layout.FIDELITY_EVIDENCE, "fidelity evidence file", "run the fidelity stage")
    plan = read_vllm_plan(root, RealPlan)
    mechanism = read_mechanism(root, MechanismEvidence)
    fidelity = read_fidelity(root, FidelityEvidence)
    assert plan is not None and mechanism is not None and fidelity is not None  # the files exist (checked above)
    table = read_policy_table(root)
    index = read_vllm_index(root, repeats=False, columns=(*INDEX_COLUMNS, "matched_to"))
    return RealArmOutputs(root, plan, mechanism, fidelity, table, index)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95 % interval (None: not measured)."""

    value: float | None
    low: float = -math.inf
    high: float = math.inf
    n: int | None = None

    def contains(self, x: float | None) -> bool:
        if x is None or self.value is None:
            return False
        slack = _EPS * max(1.0, abs(x))
        return self.low - slack <= x <= self.high + slack

    @property
    def bounded(self) -> bool:
        """Measured, with bounds of its own (not a bare point)."""
        return self.value is not None and (self.low, self.high) != (self.value, self.value)

    def describe(self, unit: str = "") -> str:
        if self.value is None:
            return "n/a"
        if not self.bounded:
            return f"{_g(self.value)}{unit}" + ("" if self.n is None else f", {self.n} seeds")
        bounds = "unbounded" if math.isinf(self.low) and math.isinf(self.high) else f"[{_g(self.low)}, {_g(self.high)}]"
        seeds = "" if self.n is None else f", {self.n} seeds"
        return f"{_g(self.value)}{unit} {bounds}{seeds}"


@dataclass(frozen=True)
class IntervalCheck:
    """One run's estimate inside the other's interval, both directions."""

    check: str
    regime: str
    what: str
    a: Interval
    b: Interval
    unit: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        if self.a.value is None and self.b.value is None:
            return True  # measured in neither: nothing that could differ
        return self.b.contains(self.a.value) and self.a.contains(self.b.value)

    def line(self) -> str:
        return (f"{self.regime} {self.what}: A {self.a.describe(self.unit)}, B {self.b.describe(self.unit)}"
                + (f" ({self.note})" if self.note else ""))

    def failure(self) -> str | None:
        if self.ok:
            return None
        if self.a.value is None or self.b.value is None:
            where = "B" if self.a.value is None else "A"
            return f"{self.check}: {self.regime} {self.what} measured in {where} only"
        pairs = (("A", self.a, "B", self.b), ("B", self.b, "A", self.a))
        outside = [f"{x} {_g(v.value)} outside {y}'s [{_g(w.low)}, {_g(w.high)}]"
                   for x, v, y, w in pairs if not w.contains(v.value)]
        return f"{self.check}: {self.regime} {self.what}: {'; '.join(outside)}"


@dataclass(frozen=True)
class FidelityMetric:
    """One held-out fidelity figure of both runs: value, 95 % bounds under the replay wander, and outcome
    against each run's own target (met / missed / undecided; None: not measured)."""

    regime: str
    metric: str
    target: str
    a: Interval
    b: Interval
    outcome_a: FidelityOutcome | None
    outcome_b: FidelityOutcome | None
    pooled: bool = False

    @property
    def ok(self) -> bool:
        """The same outcome; or, when both carry bounds, each value inside the other's bounds and no target met
        in one run and missed in the other."""
        if self.outcome_a == self.outcome_b:
            return True
        contradict = {self.outcome_a, self.outcome_b} == {"met", "missed"}
        return (self.a.bounded and self.b.bounded and self.a.contains(self.b.value) and self.b.contains(self.a.value)
                and not contradict)

    def line(self) -> str:
        def one(v: Interval, outcome: FidelityOutcome | None) -> str:
            return f"{v.describe()} ({outcome or 'not measured'})"

        where = " (pooled)" if self.pooled else ""
        return (f"{self.regime}{where} {self.metric} (target {self.target}): "
                f"A {one(self.a, self.outcome_a)}, B {one(self.b, self.outcome_b)}")

    def failure(self) -> str | None:
        if self.ok:
            return None
        if {self.outcome_a, self.outcome_b} == {"met", "missed"}:
            met, missed = ("A", "B") if self.outcome_a == "met" else ("B", "A")
            return f"fidelity: {self.regime} {self.metric} meets its target {self.target} in {met}, misses it in {missed}"
        return (f"fidelity: {self.regime} {self.metric}: A {self.outcome_a or 'not measured'} "
                f"({self.a.describe()}), B {self.outcome_b or 'not measured'} ({self.b.describe()})")


@dataclass(frozen=True)
class Reproduction:
    """Everything `compare_real_arms` found; `failures` is empty when the real arm reproduces."""

    a: Path
    b: Path
    regimes: list[str]
    plan_differences: list[str] = field(default_factory=list)
    tier_differences: list[str] = field(default_factory=list)
    n_tiers: int = 0
    gates: list[IntervalCheck] = field(default_factory=list)
    fidelity: list[FidelityMetric] = field(default_factory=list)
    real_vs_random: list[IntervalCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        out = [f"plans: {d}" for d in self.plan_differences] + [f"tiers: {d}" for d in self.tier_differences]
        for check in (*self.gates, *self.fidelity, *self.real_vs_random):
            failure = check.failure()
            if failure is not None:
                out.append(failure)
        return out

    @property
    def reproduces(self) -> bool:
        return not self.failures


# --------------------------------------------------------------------------- 1. plans


def _time_scale_gap(a: float, b: float) -> float:
    return max(a, b) / min(a, b) - 1.0


def _equal(x: object, y: object) -> bool:
    if isinstance(x, float) or isinstance(y, float):
        return math.isclose(float(x), float(y), rel_tol=_EPS)  # type: ignore[arg-type]
    return x == y


def plan_differences(a: RealPlan, b: RealPlan, time_scale_tolerance: float = DEFAULT_TIME_SCALE_TOLERANCE) -> list[str]:
    """Every planned field that differs between the plans, named (empty: the same plan)."""
    out: list[str] = []
    if set(a.regimes) != set(b.regimes):
        out.append(f"planned regimes differ: A {sorted(a.regimes)}, B {sorted(b.regimes)}")
    for regime in [r for r in a.regimes if r in b.regimes]:
        pa, pb = a.regimes[regime], b.regimes[regime]
        for name in PLAN_FIELDS:
            va, vb = getattr(pa, name), getattr(pb, name)
            if not _equal(va, vb):
                out.append(f"{regime} {name} differs: A {va}, B {vb}")
        gap = _time_scale_gap(pa.time_scale, pb.time_scale)
        if gap > time_scale_tolerance + _EPS:
            out.append(f"{regime} time_scale differs by {gap:.1%} (more than {time_scale_tolerance:.0%}): "
                       f"A {_g(pa.time_scale)}, B {_g(pb.time_scale)}")
    return out


# --------------------------------------------------------------------------- 2. tiers


def _tiers(table: pd.DataFrame) -> dict[tuple[str, ...], str]:
    keys = ["regime", "policy", *(["block"] if "block" in table.columns else [])]
    return {tuple(str(v) for v in key): str(tier) for *key, tier in table[[*keys, "tier"]].itertuples(index=False)}


def tier_differences(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Every (regime, policy) whose tier differs, or that one policy table lacks."""
    ta, tb = _tiers(a), _tiers(b)
    out = []
    for key in sorted(set(ta) | set(tb)):
        name = "/".join(key)
        if key not in tb:
            out.append(f"{name} only in A ({ta[key]!r})")
        elif key not in ta:
            out.append(f"{name} only in B ({tb[key]!r})")
        elif ta[key] != tb[key]:
            out.append(f"{name}: A {ta[key]!r}, B {tb[key]!r}")
    return out


# --------------------------------------------------------------------------- 3. the gate


def gate_interval(mechanism: MechanismEvidence, regime: str) -> Interval:
    m = mechanism.regimes.get(regime)
    if m is None or m.gate_ratio is None:
        return Interval(None)
    low = -math.inf if m.gate_ratio_ci_low is None else m.gate_ratio_ci_low
    high = math.inf if m.gate_ratio_ci_high is None else m.gate_ratio_ci_high
    return Interval(m.gate_ratio, low, high)


def gate_check(a: MechanismEvidence, b: MechanismEvidence, regime: str) -> IntervalCheck:
    ia, ib = gate_interval(a, regime), gate_interval(b, regime)
    note = "no gate ratio in either run" if ia.value is None and ib.value is None else ""
    return IntervalCheck("gate", regime, "gate ratio", ia, ib, note=note)


# --------------------------------------------------------------------------- 4. fidelity


def _measured(evidence: FidelityEvidence, regime: str) -> tuple[RegimeFidelity | FidelityEvidence, bool]:
    """The regime's own figures, else the pooled ones (as `FidelityEvidence.failures` judges); and whether pooled."""
    own = evidence.regimes.get(regime)
    return (own, False) if own is not None else (evidence, True)


def _fidelity_interval(measured: RegimeFidelity | FidelityEvidence, name: str) -> Interval:
    value = getattr(measured, name) if measured.n_held_out_replays > 0 else None
    if value is None:
        return Interval(None)
    low, high = measured.bounds.get(name, (value, value))
    return Interval(value, low, high)


def fidelity_metrics(a: FidelityEvidence, b: FidelityEvidence, regime: str) -> list[FidelityMetric]:
    """The regime's held-out figures of both runs, each judged against its own run's targets."""
    (ma, pooled_a), (mb, pooled_b) = _measured(a, regime), _measured(b, regime)
    out = []
    for label, name, _ in FIDELITY_FIGURES:
        ia, ib = _fidelity_interval(ma, name), _fidelity_interval(mb, name)
        oa = fidelity_outcome(name, ia.value, ma.bounds.get(name), a.targets)
        ob = fidelity_outcome(name, ib.value, mb.bounds.get(name), b.targets)
        out.append(FidelityMetric(regime, label, target_text(name, a.targets), ia, ib, oa, ob,
                                  pooled=pooled_a or pooled_b))
    return out


# --------------------------------------------------------------------------- 5. real controller minus matched random


def t_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Mean and t interval over seeds; unbounded with fewer than two values, a point when they are equal."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Interval(None, n=0)
    mean = float(data.mean())
    if data.size < 2:
        return Interval(mean, n=1)
    sem = float(scipy.stats.sem(data))
    if sem == 0.0:
        return Interval(mean, mean, mean, n=int(data.size))
    low, high = scipy.stats.t.interval(confidence, df=data.size - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), n=int(data.size))


def _valid(index: pd.DataFrame) -> pd.DataFrame:
    if "valid" not in index.columns:
        return index
    return index[index["valid"].astype(str).str.strip().str.lower() != "false"]


def seed_differences(index: pd.DataFrame, regime: str, controller: str, column: str) -> np.ndarray:
    """Per seed with both: `controller`'s value of `column` minus the mean of its span-matched draws (valid
    real replays of `regime` only; a seed's repeated rows averaged)."""
    rows = _valid(index[index["regime"].astype(str) == regime])
    own = rows[rows["policy"].astype(str) == controller].groupby("seed")[column].mean()
    draws = rows[(rows["policy"].astype(str) == DRAW_POLICY) & (rows["matched_to"].astype(str) == controller)]
    matched = draws.groupby("seed")[column].mean()
    seeds = sorted(set(own.dropna().index) & set(matched.dropna().index))
    return np.array([own[s] - matched[s] for s in seeds], dtype=float)


#: (index column, label, unit, scale to display units).
REAL_METRICS = (("slo_violation_rate", "SLO violation rate", " pp", 100.0), ("p95_ms", "p95", " ms", 1.0))


def _primary(plan: RealPlan, regime: str) -> str | None:
    p: RegimePlan | None = plan.regimes.get(regime)
    return p.controllers[0] if p is not None else None


def real_vs_random_checks(a: RealArmOutputs, b: RealArmOutputs, regime: str) -> list[IntervalCheck]:
    """Per metric: the primary controller minus its matched random, mean over seeds, both runs."""
    ca, cb = _primary(a.plan, regime), _primary(b.plan, regime)
    controller = ca or cb or ""
    note = f"primary A {ca}, B {cb}" if ca != cb else ""
    out = []
    for column, label, unit, scale in REAL_METRICS:
        ia = t_interval(seed_differences(a.index, regime, ca, column) * scale) if ca else Interval(None)
        ib = t_interval(seed_differences(b.index, regime, cb, column) * scale) if cb else Interval(None)
        what = f"{controller} - matched random {label}"
        out.append(IntervalCheck("real vs random", regime, what, ia, ib, unit, note))
    return out


# --------------------------------------------------------------------------- the comparison


def _regimes(a: RealPlan, b: RealPlan) -> list[str]:
    return [*a.regimes, *(r for r in b.regimes if r not in a.regimes)]


def compare_outputs(a: RealArmOutputs, b: RealArmOutputs,
                    time_scale_tolerance: float = DEFAULT_TIME_SCALE_TOLERANCE) -> Reproduction:
    """Checks 1-5 of the module docstring on two runs' outputs."""
    regimes = _regimes(a.plan, b.plan)
    notes = [] if regimes else ["neither plan replays a regime (real arm switched off?): only the tiers are compared"]
    return Reproduction(
        a=a.root, b=b.root, regimes=regimes,
        plan_differences=plan_differences(a.plan, b.plan, time_scale_tolerance),
        tier_differences=tier_differences(a.policy_table, b.policy_table),
        n_tiers=len(set(_tiers(a.policy_table)) | set(_tiers(b.policy_table))),
        gates=[gate_check(a.mechanism, b.mechanism, r) for r in regimes],
        fidelity=[m for r in regimes for m in fidelity_metrics(a.fidelity, b.fidelity, r)],
        real_vs_random=[c for r in regimes for c in real_vs_random_checks(a, b, r)],
        notes=notes,
    )


def compare_real_arms(a: PathLike, b: PathLike,
                      time_scale_tolerance: float = DEFAULT_TIME_SCALE_TOLERANCE) -> Reproduction:
    """Read both roots' real-arm outputs (BadInput naming a missing or malformed file) and compare them."""
    return compare_outputs(load_outputs(a), load_outputs(b), time_scale_tolerance)


def render(result: Reproduction) -> list[str]:
    """The comparison as plain lines, one section per check (failures are `result.failures`)."""

    def mark(ok: bool) -> str:
        return "ok  " if ok else "DIFF"

    plans = "same plan" if not result.plan_differences else f"{len(result.plan_differences)} difference(s)"
    tiers = "same tiers" if not result.tier_differences else f"{len(result.tier_differences)} difference(s)"
    lines = [f"A: {result.a}", f"B: {result.b}", f"regimes: {', '.join(result.regimes) or '-'}",
             f"{mark(not result.plan_differences)} plans: {plans}",
             *(f"       {d}" for d in result.plan_differences),
             f"{mark(not result.tier_differences)} tiers: {tiers} ({result.n_tiers} regime x policy rows)",
             *(f"       {d}" for d in result.tier_differences)]
    sections: list[tuple[str, list[IntervalCheck] | list[FidelityMetric]]] = [
        ("gate ratio in the other's 95 % bounds", result.gates),
        ("held-out fidelity, same outcome or inside each other's bounds", result.fidelity),
        ("real controller - matched random in the other's 95 % interval", result.real_vs_random)]
    for title, checks in sections:
        lines.append(f"{title}:")
        lines += [f"{mark(c.ok)}   {c.line()}" for c in checks] or ["       -"]
    lines += [f"note: {n}" for n in result.notes]
    return lines


def _g(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g}"


__all__ = ["DEFAULT_TIME_SCALE_TOLERANCE", "FidelityMetric", "Interval", "IntervalCheck", "RealArmOutputs",
           "Reproduction", "compare_outputs", "compare_real_arms", "fidelity_metrics", "gate_check", "load_outputs",
           "plan_differences", "real_vs_random_checks", "render", "seed_differences", "t_interval",
           "tier_differences"]
