"""The real-server evidence the verdicts rest on: mechanism and simulator fidelity.

Two JSON files, written by the calibration side of the pipeline and read by
the verdicts (:mod:`syncsafe.analysis.verdicts`), so both sides share these
models and nothing else:

- :class:`MechanismEvidence` (``runs/calibration/mechanism.json``): per
  regime, does a merge slow the real server (vLLM) at all? Gate of the tier
  *mechanism transfers*.
- :class:`FidelityEvidence` (``runs/fidelity/fidelity.json``): was the
  simulator that produced the verdict-scale replays fitted to real replays
  (``calibration: fitted``), and does it reproduce real replays of seeds the
  fit never saw (p95 error, SLO-rate error, paired sync ratio, and the sign of
  controller-minus-matched-random per held-out seed)? Gate of every tier above
  *mechanism transfers* that rests on simulator replays.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from syncsafe.config import FidelityTargets
from syncsafe.realarm.gate import Outcome, gate_outcome

DEFAULT_GATE_RATIO_THRESHOLD = 1.05



def _renamed(data: Any, old: str, new: str) -> Any:
    """Evidence files written before a field was renamed: their `old` key reads as `new`."""
    if isinstance(data, dict) and old in data:
        data = dict(data)
        data.setdefault(new, data.pop(old))
    return data

class NoSyncSpread(BaseModel):
    """One seed's noise floor: p95 E2E and SLO-violation rate of each of its no-sync controls."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int
    p95_ms: list[float]
    slo_pct: list[float]
    #: Largest p95 over the smallest, minus one (0.1 = the controls' p95 differ by 10 %).
    p95_spread: float | None = None
    slo_range_pp: float | None = None


class RegimeMechanism(BaseModel):
    """Real-backend measurement of the merge mechanism in one regime (pooled over its replayed seeds).

    See `syncsafe.analysis.calibration.mechanism`: merge-active requests are
    chosen by arrival (a nominal lifetime overlapping a window), each replay
    with merges is paired with its nearest no-sync control (`twin`) and the
    next-nearest (the drift control). All ratios are of p95 E2E latency.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Merge-active requests in the replays with merges / the same request ids in their nearest control.
    sync_ratio_paired: float = Field(gt=0)
    #: Merge-active / merge-inactive requests within the replays with merges (confounded by load; a diagnostic).
    sync_ratio_unpaired: float | None = Field(default=None, gt=0)
    #: High / low inference-pressure requests of the no-sync replays (a diagnostic).
    pressure_ratio: float | None = Field(default=None, gt=0)
    #: Drift control: the same requests in the next-nearest control / in the nearest.
    #: None: no second no-sync control, and then the gate fails.
    drift_ratio: float | None = Field(default=None, gt=0)
    #: sync_ratio_paired / max(drift_ratio, 1 / drift_ratio): the gate's statistic.
    gate_ratio: float | None = Field(default=None, gt=0)
    #: One-sided 95 % block-bootstrap bounds of `gate_ratio`.
    gate_ratio_ci_low: float | None = Field(default=None, gt=0)
    gate_ratio_ci_high: float | None = Field(default=None, gt=0)
    n_bootstrap: int = Field(default=0, ge=0)
    #: Length of the resampled blocks of consecutive arrivals (trace seconds).
    block_s: float | None = Field(default=None, gt=0)
    #: Wander of a whole replay's log p95 E2E, from the no-sync controls (pooled within-seed sd), and its degrees
    #: of freedom: carried into the gate's bounds (`syncsafe.realarm.gate.ReplayNoise`).
    replay_sd: float | None = Field(default=None, ge=0)
    replay_sd_df: int | None = Field(default=None, ge=1)
    backend: Literal["vllm"] = "vllm"
    seeds: list[int] = Field(default_factory=list)
    n_requests: int | None = Field(default=None, ge=0, description="real requests of the replays with merges")
    n_merge_active: int | None = Field(default=None, ge=0)
    #: No-sync controls per seed, and their spread (the noise floor).
    n_controls: int | None = Field(default=None, ge=0)
    no_sync_spread: list[NoSyncSpread] = Field(default_factory=list)
    #: The plan's chance that the gate passes at the profiled effect, and the target it was sized for.
    power: float | None = Field(default=None, ge=0, le=1)
    power_target: float | None = Field(default=None, gt=0, le=1)
    #: The load the replays ran at: trace seconds per wall second, span, busiest window's share of capacity.
    time_scale: float | None = Field(default=None, gt=0)
    span_s: float | None = Field(default=None, gt=0)
    utilisation: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        """`sync_ratio` (the paired ratio under its old, ambiguous name) reads as `sync_ratio_paired`."""
        return _renamed(data, "sync_ratio", "sync_ratio_paired")

    def outcome(self, threshold: float) -> Outcome:
        """passed / failed / inconclusive against `threshold` (`syncsafe.realarm.gate.gate_outcome`)."""
        return gate_outcome(self.gate_ratio_ci_low, self.gate_ratio_ci_high, threshold)

    @property
    def underpowered(self) -> bool:
        """The plan's power was unknown or below its target."""
        return self.power is None or self.power_target is None or self.power < self.power_target


class MechanismEvidence(BaseModel):
    """Per-regime merge mechanism, measured on the real serving backend (the gate of *mechanism transfers*)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    regimes: dict[str, RegimeMechanism]
    #: The bootstrap lower bound of `gate_ratio` (the drift-corrected paired sync ratio) must exceed this.
    gate_ratio_threshold: float = Field(default=DEFAULT_GATE_RATIO_THRESHOLD, ge=1.0)
    #: Real replays marked invalid (regime, seed, path, reason): they license nothing.
    invalid_replays: list[dict[str, Any]] = Field(default_factory=list)
    #: Regimes of the real arm without a measurement, and why (not planned, nothing merge-active, ...).
    unmeasured: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        """`sync_ratio_threshold` (its old name: it bounds the gate ratio) reads as `gate_ratio_threshold`."""
        return _renamed(data, "sync_ratio_threshold", "gate_ratio_threshold")

    @classmethod
    def read(cls, path: str | Path) -> MechanismEvidence:
        """Load from a JSON file with this model's fields."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def failure(self, regime: str) -> str | None:
        """Why the gate does not pass for `regime` (None: it passes)."""
        m = self.regimes.get(regime)
        if m is None:
            reasons = [self.unmeasured[regime]] if regime in self.unmeasured else []
            busy = [r for r in self.invalid_replays if r.get("regime") == regime]
            if busy:
                reasons.append(f"{len(busy)} invalid real replays, e.g. {busy[0]['reason']}")
            why = f" ({'; '.join(reasons)})" if reasons else ""
            return f"no real-backend (vllm) mechanism measurement for regime {regime!r}{why}"
        if m.drift_ratio is None:
            return "no drift control (no second no-sync control): the measurement licenses nothing"
        if m.gate_ratio_ci_low is None and m.gate_ratio_ci_high is None:
            return "no bootstrap bound of the drift-corrected sync ratio"
        threshold = self.gate_ratio_threshold
        outcome = m.outcome(threshold)
        if outcome == "passed":
            return None
        bounds = f"95 % bounds [{_fmt(m.gate_ratio_ci_low)}, {_fmt(m.gate_ratio_ci_high)}]"
        if outcome == "failed":
            return f"failed decisively: {bounds} of the drift-corrected paired sync ratio, all below {threshold:.3g}"
        power = "power not planned" if m.power is None else f"planned power {m.power:.0%}"
        if m.underpowered:
            return f"underpowered ({power}): inconclusive, {bounds} straddle {threshold:.3g}"
        return f"inconclusive at {power}: {bounds} straddle {threshold:.3g}"

    def shows(self, regime: str) -> bool:
        """True when the lower 95 % bound of (paired sync ratio / drift) exceeds the threshold."""
        return self.failure(regime) is None

    def describe(self, regime: str) -> str:
        m = self.regimes.get(regime)
        if m is None:
            return self.failure(regime) or ""
        text = f"vllm paired sync ratio {m.sync_ratio_paired:.3g}"
        if m.drift_ratio is not None:
            text += f", drift {m.drift_ratio:.3g}"
        if m.gate_ratio is not None:
            text += (f", drift-corrected {m.gate_ratio:.3g} (95 % bounds [{_fmt(m.gate_ratio_ci_low)}, "
                     f"{_fmt(m.gate_ratio_ci_high)}], block bootstrap"
                     + (f" with replay-level sd {m.replay_sd:.3g} on {m.replay_sd_df} df" if m.replay_sd is not None
                        else "") + f"; threshold {self.gate_ratio_threshold:.3g})")
        if m.power is not None:
            text += f", planned power {m.power:.0%}"
        failure = self.failure(regime)
        return text + (f"; {failure}" if failure else "; passes")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


FidelityOutcome = Literal["met", "missed", "undecided"]

#: The judged held-out figures: (name in the report, field, unit).
FIDELITY_FIGURES = (
    ("held-out p95 error", "p95_rel_error_max", "%"),
    ("held-out SLO-rate error", "slo_abs_error_pp_max", " pp"),
    ("paired sync ratio sim/real", "sync_ratio_paired_sim_over_real", ""),
)


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return "not computable"
    return f"{value:.0%}" if unit == "%" else f"{value:.3g}{unit}"


def target_text(field: str, t: FidelityTargets) -> str:
    """A judged figure's target in words."""
    if field == "sync_ratio_paired_sim_over_real":
        return f"in [{t.sync_ratio_paired_low:g}, {t.sync_ratio_paired_high:g}]"
    return f"<= {t.p95_rel_error_max:.0%}" if field == "p95_rel_error_max" else f"<= {t.slo_abs_error_pp_max:g} pp"


def fidelity_outcome(field: str, value: float | None, bounds: tuple[float, float] | None,
                     t: FidelityTargets) -> FidelityOutcome | None:
    """met: the whole 95 % range (the value itself without bounds) meets the target; missed: none of it does;
    undecided: the range straddles it. None: not measured."""
    if value is None:
        return None
    low, high = bounds if bounds is not None else (value, value)
    if not (math.isfinite(value) and math.isfinite(low) and math.isfinite(high)):
        return "missed"
    if field == "sync_ratio_paired_sim_over_real":
        inside = [t.sync_ratio_paired_low <= v <= t.sync_ratio_paired_high for v in (low, high)]
        if all(inside):
            return "met"
        return "missed" if high < t.sync_ratio_paired_low or low > t.sync_ratio_paired_high else "undecided"
    limit = t.p95_rel_error_max if field == "p95_rel_error_max" else t.slo_abs_error_pp_max
    return "met" if high <= limit else "missed" if low > limit else "undecided"


class SignAgreement(BaseModel):
    """One held-out seed: controller minus matched-random mean SLO %, real vs simulated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    regime: str
    policy: str
    seed: int
    n_draws: int = Field(ge=1)
    real_delta_pct: float
    sim_delta_pct: float

    @property
    def tie(self) -> bool:
        """Real and simulated differences both exactly zero: agreement that carries no information."""
        return self.real_delta_pct == 0 and self.sim_delta_pct == 0

    @property
    def agree(self) -> bool:
        """Same sign, zero counting as its own sign (a tie agrees, but is no evidence: `tie`)."""
        return (self.real_delta_pct > 0) == (self.sim_delta_pct > 0) and (self.real_delta_pct < 0) == (
            self.sim_delta_pct < 0
        )


class RegimeFidelity(BaseModel):
    """The simulator's errors on one regime's held-out real replays."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_held_out_replays: int = Field(default=0, ge=0)
    #: Largest relative p95 error; infinite when a replay's error could not be computed (which fails it).
    p95_rel_error_max: float | None = None
    slo_abs_error_pp_max: float | None = None
    sync_ratio_paired_sim_over_real: float | None = None
    #: 95 % bounds of those three under the server's replay-to-replay wander, by field name
    #: (`syncsafe.analysis.calibration.fidelity_bounds`); a figure without bounds is judged as measured.
    bounds: dict[str, tuple[float, float]] = Field(default_factory=dict)


class FidelityEvidence(BaseModel):
    """Held-out fidelity of the simulator that licensed the verdicts.

    A simulator row of (policy, regime) is licensed (`failures(policy, regime)` empty) only when the
    simulator was fitted, the regime's held-out replays meet every target (`fidelity_outcome`: the whole
    95 % range under the server's replay-to-replay wander meets it), and the policy was checked on
    the real server in that regime: on every declared held-out seed a valid real replay of it and its
    draws whose controller-minus-random sign the simulator reproduces, at least one of them a real,
    non-zero difference (zero against zero on every seed is agreement that carries no information).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: ``fitted``: the simulator used the calibrate-fit stage's parameters; ``default``: shipped defaults.
    calibration: Literal["fitted", "default"]
    targets: FidelityTargets = FidelityTargets()
    fit_seeds: list[int] = Field(default_factory=list)
    held_out_seeds: list[int] = Field(default_factory=list)
    n_held_out_replays: int = Field(default=0, ge=0)
    #: Observed errors over the held-out real replays (None: nothing to measure).
    p95_rel_error_max: float | None = None
    p95_rel_error_mean: float | None = None
    slo_abs_error_pp_max: float | None = None
    slo_abs_error_pp_mean: float | None = None
    #: Paired sync ratio (merge-active p95 / same ids in their nearest no-sync control) over the held-out replays.
    sync_ratio_paired_real: float | None = None
    sync_ratio_paired_sim: float | None = None
    sync_ratio_paired_sim_over_real: float | None = None
    #: Bounds of the three judged figures (as `RegimeFidelity.bounds`), and the wander they carry: the sd of a
    #: whole replay's log p95 E2E from the no-sync controls of every replayed seed, and its degrees of freedom.
    bounds: dict[str, tuple[float, float]] = Field(default_factory=dict)
    replay_sd: float | None = Field(default=None, ge=0)
    replay_sd_df: int | None = Field(default=None, ge=1)
    #: Refits of the calibration on shocked fit replays whose predictions the bounds carry (0: the fitted side is
    #: taken as exact; `syncsafe.analysis.calibration.refits`).
    refits: int = Field(default=0, ge=0)
    #: The same errors per regime (the licence of a regime's rows rests on its own).
    regimes: dict[str, RegimeFidelity] = Field(default_factory=dict)
    sign_agreement: list[SignAgreement] = Field(default_factory=list)
    #: Why the simulator is not (or only partly) trusted, in words for the report.
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        """`sync_ratio_sim_over_real` (its old name) reads as `sync_ratio_paired_sim_over_real`."""
        return _renamed(data, "sync_ratio_sim_over_real", "sync_ratio_paired_sim_over_real")

    @classmethod
    def read(cls, path: str | Path) -> FidelityEvidence:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def _target_failures(self, measured: RegimeFidelity | FidelityEvidence, where: str) -> list[str]:
        if measured.n_held_out_replays == 0:
            return [f"no held-out real replays{where} to judge the simulator on"]
        wander = (f"the server's replay-to-replay wander (sd {self.replay_sd:.2g} of a replay's log p95) leaves it "
                  "undecided") if self.replay_sd is not None else "undecided"
        out: list[str] = []
        for name, field, unit in FIDELITY_FIGURES:
            value, target = getattr(measured, field), target_text(field, self.targets)
            bounds = measured.bounds.get(field)
            shown = _figure(value, unit) + (f" [{_figure(bounds[0], unit)}, {_figure(bounds[1], unit)}]"
                                            if bounds else "")
            outcome = fidelity_outcome(field, value, bounds, self.targets)
            if value is None:
                out.append(f"{name}{where} not measured (target {target})")
            elif outcome == "missed":
                out.append(f"{name}{where} {shown} misses its target {target}")
            elif outcome == "undecided":
                out.append(f"{name}{where} {shown}: {wander} against its target {target}")
        return out

    def _sign_failures(self, policy: str, regime: str) -> list[str]:
        mine = [a for a in self.sign_agreement if a.policy == policy and a.regime == regime]
        if not mine:
            return [f"{policy} was not checked on the real server in {regime} (no held-out real replay of it "
                    "and its draws): the simulator's rows of it license no more than mechanism transfers"]
        if not self.held_out_seeds:
            return ["no held-out seeds declared: the sign check would rest on the fit's own seeds"]
        out = []
        by_seed = {a.seed: a for a in mine}
        missing = [s for s in self.held_out_seeds if s not in by_seed]
        if missing:
            out.append(f"held-out seed(s) {missing} of {regime} have no valid real replay of {policy} and its "
                       "draws (invalid or missing): the sign check is incomplete")
        held = [by_seed[s] for s in self.held_out_seeds if s in by_seed]
        disagree = [a for a in held if not a.agree]
        if disagree:
            seeds = ", ".join(f"seed {a.seed}" for a in disagree)
            out.append(f"simulator and real server disagree on the sign of {policy} minus random in {regime} ({seeds})")
        if held and not any(a.real_delta_pct != 0 and a.agree for a in held):
            ties = sum(a.tie for a in held)
            out.append(f"no held-out seed of {policy} in {regime} with a non-zero real controller-minus-random "
                       f"difference ({ties} of {len(held)} zero against zero): the sign check carries no information")
        return out

    def failures(self, policy: str | None = None, regime: str | None = None) -> list[str]:
        """Every reason the simulator's rows of (`policy`, `regime`) are not licensed (empty: licensed).

        Without a (policy, regime): the simulator-wide reasons only (calibration, pooled targets).
        """
        out: list[str] = []
        if self.calibration != "fitted":
            out.append("simulator runs on shipped default parameters (calibration: default), not a fit to real replays")
        if regime is not None and regime in self.regimes:
            out += self._target_failures(self.regimes[regime], f" in {regime}")
        else:  # the pooled figures (evidence written without per-regime ones)
            out += self._target_failures(self, "")
        if policy is not None and regime is not None:
            out += self._sign_failures(policy, regime)
        return out

    def licenses(self, policy: str | None = None, regime: str | None = None) -> bool:
        """True when the simulator is fitted and meets every held-out target (for `policy` in `regime`)."""
        return not self.failures(policy, regime)

    def describe(self, policy: str | None = None, regime: str | None = None) -> str:
        failures = self.failures(policy, regime)
        if not failures:
            where = f" for {policy} in {regime}" if policy and regime else ""
            return (
                f"fitted simulator meets its held-out targets{where} on {self.n_held_out_replays} real replays "
                f"(seeds {self.held_out_seeds})"
            )
        return "; ".join(failures)
