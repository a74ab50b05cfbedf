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

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from syncsafe.config import FidelityTargets

DEFAULT_SYNC_RATIO_THRESHOLD = 1.05


class RegimeMechanism(BaseModel):
    """Real-backend measurement of the merge mechanism in one regime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sync_ratio: float = Field(gt=0, description="real p95 latency while a merge is active / inactive")
    pressure_ratio: float = Field(gt=0, description="real p95 latency under high / low fleet pressure")
    backend: Literal["vllm"] = "vllm"
    n_requests: int | None = Field(default=None, ge=0, description="real requests behind the ratios")
    drift_ratio: float | None = Field(
        default=None, gt=0,
        description="control: p95 of requests done before any merge / the same requests in the no-sync replay "
                    "(about 1 when the server behaved alike across replays)",
    )


class MechanismEvidence(BaseModel):
    """Per-regime effect-size transfer, measured on the real serving backend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    regimes: dict[str, RegimeMechanism]
    sync_ratio_threshold: float = Field(default=DEFAULT_SYNC_RATIO_THRESHOLD, ge=1.0)
    #: A measurement whose pre-merge control drifts beyond this factor (either way) licenses nothing.
    max_drift: float = Field(default=1.25, ge=1.0)

    @classmethod
    def read(cls, path: str | Path) -> MechanismEvidence:
        """Load from a JSON file with this model's fields."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def drifted(self, regime: str) -> bool:
        """True when the regime's pre-merge control shows the server itself changed between replays."""
        measured = self.regimes.get(regime)
        drift = measured.drift_ratio if measured is not None else None
        return drift is not None and not 1.0 / self.max_drift <= drift <= self.max_drift

    def shows(self, regime: str) -> bool:
        """True when the regime's real sync ratio exceeds the threshold and its control did not drift."""
        measured = self.regimes.get(regime)
        return measured is not None and measured.sync_ratio > self.sync_ratio_threshold and not self.drifted(regime)

    def describe(self, regime: str) -> str:
        measured = self.regimes.get(regime)
        if measured is None:
            return f"no real-backend (vllm) mechanism measurement for regime {regime!r}"
        relation = ">" if measured.sync_ratio > self.sync_ratio_threshold else "<="
        text = (
            f"vllm sync ratio {measured.sync_ratio:.3g} {relation} {self.sync_ratio_threshold:.3g}, "
            f"pressure ratio {measured.pressure_ratio:.3g}"
        )
        if measured.drift_ratio is not None:
            verdict = "drifted: measurement not trusted" if self.drifted(regime) else "within"
            text += f", pre-merge control {measured.drift_ratio:.3g} ({verdict} ×{self.max_drift:.3g})"
        return text


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
    def agree(self) -> bool:
        """Same sign (a tie counts only with a tie)."""
        return (self.real_delta_pct > 0) == (self.sim_delta_pct > 0) and (self.real_delta_pct < 0) == (
            self.sim_delta_pct < 0
        )


class FidelityEvidence(BaseModel):
    """Held-out fidelity of the simulator that licensed the verdicts."""

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
    sync_ratio_sim_over_real: float | None = None
    sign_agreement: list[SignAgreement] = Field(default_factory=list)
    #: Why the simulator is not (or only partly) trusted, in words for the report.
    notes: list[str] = Field(default_factory=list)

    @classmethod
    def read(cls, path: str | Path) -> FidelityEvidence:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def failures(self) -> list[str]:
        """Every reason the simulator's verdicts are not licensed (empty: licensed)."""
        t = self.targets
        out: list[str] = []
        if self.calibration != "fitted":
            out.append("simulator runs on shipped default parameters (calibration: default), not a fit to real replays")
        if self.n_held_out_replays == 0:
            out.append("no held-out real replays to judge the simulator on")
        checks = (
            ("held-out p95 error", self.p95_rel_error_max, lambda v: v <= t.p95_rel_error_max,
             f"<= {t.p95_rel_error_max:.0%}", lambda v: f"{v:.0%}"),
            ("held-out SLO-rate error", self.slo_abs_error_pp_max, lambda v: v <= t.slo_abs_error_pp_max,
             f"<= {t.slo_abs_error_pp_max:g} pp", lambda v: f"{v:.3g} pp"),
            ("paired sync ratio sim/real", self.sync_ratio_sim_over_real,
             lambda v: t.sync_ratio_low <= v <= t.sync_ratio_high, f"in [{t.sync_ratio_low:g}, {t.sync_ratio_high:g}]",
             lambda v: f"{v:.3g}"),
        )
        for name, value, ok, target, fmt in checks:
            if value is None:
                out.append(f"{name} not measured (target {target})")
            elif not ok(value):
                out.append(f"{name} {fmt(value)} misses its target {target}")
        held = set(self.held_out_seeds)
        agreements = [a for a in self.sign_agreement if a.seed in held] if held else list(self.sign_agreement)
        if not agreements:
            out.append("no held-out seed with real controller-minus-random to check the sign on")
        disagree = [a for a in agreements if not a.agree]
        if disagree:
            seeds = ", ".join(f"{a.regime}/{a.policy}/seed {a.seed}" for a in disagree)
            out.append(f"simulator and real server disagree on the sign of controller-minus-random ({seeds})")
        return out

    def licenses(self) -> bool:
        """True when the simulator is fitted and meets every held-out target."""
        return not self.failures()

    def describe(self) -> str:
        failures = self.failures()
        if not failures:
            return (
                f"fitted simulator meets its held-out targets on {self.n_held_out_replays} real replays "
                f"(seeds {self.held_out_seeds})"
            )
        return "; ".join(failures)
