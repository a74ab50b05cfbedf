"""Merge policies: small objects that decide, each control cycle, merge or defer.

Every policy answers `decide(reports, signals, clock) -> Decision` with a
reason string for the decision log. The shared rules come first and no
policy can override them: no merge before `min_h` inner steps since the last
one, a forced merge at `max_h`. Between the two, each policy applies its own
rule:

- `fixed_h`: merge once `h` steps have passed (DiLoCo's fixed cadence).
- `pressure_gate`: merge while fleet pressure is at or below a threshold.
- `random_deferral`: defer with a fixed probability (seeded), else merge.
- `wa_diloco`: workload-aware score, merge when it reaches a threshold:
      score = w_progress * progress + w_staleness * staleness - w_pressure * pressure
  progress is the islands' mean relative loss drop over the cycle (scaled by
  `progress_scale`, capped at 1): while islands still improve fast, their
  pseudo-gradients are worth sharing. staleness is steps since the last merge
  over max_h: the longer islands drift, the costlier further deferral. That
  is the design's "learner progress - fleet pressure - staleness", with
  staleness counted as the debt that deferral runs up.
- `wa_calibrated`: wa_diloco - w_cost * the calibrated expected serving cost
  of a merge starting now.
- `wa_forecast`: wa_diloco - w_forecast * the EWMA forecast of pressure over
  the coming merge window.
- `wa_seasonal`: as wa_forecast with the period-detecting forecaster.
- `wa_lookahead` (control/lookahead.py): merge now only if the calibrated
  cost of a merge now is no more than the expected cost of waiting for a
  later feasible cycle (forecasts from past samples, optimal stopping up to
  the forced merge), with wa_diloco's progress and staleness as the cost of
  deferral.

Forecasting policies also see every fleet sample observed between decisions
through `observe`.

Ablated variants (`wa_diloco-pressure`, `wa_lookahead-lookahead`, ...) are
these classes with one term switched off by parameters (`build_policy`).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from syncsafe.config import ControlConfig, MergeConfig, ScoreWeights, split_policy
from syncsafe.control.forecasters import EwmaForecaster, SeasonalForecaster
from syncsafe.control.types import ClockState, Decision, FleetSignals, LearnerReport
from syncsafe.control.serving_model import Calibration


class Policy(ABC):
    """min_h / max_h rules shared by every policy; subclasses decide in between."""

    name: str

    def observe(self, samples: Sequence[FleetSignals]) -> None:
        """Fleet samples seen since the last decision (ignored unless the policy forecasts)."""

    def state(self) -> dict[str, Any]:
        """What changes as the policy runs (random stream, forecast history), JSON-able: a run resumed from a
        merge checkpoint rebuilds the policy from params and `restore`s this (none for stateless policies)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what `state` returned."""

    def decide(self, reports: Sequence[LearnerReport], signals: FleetSignals, clock: ClockState) -> Decision:
        since = clock.steps_since_merge
        if since < clock.min_h:
            return Decision(False, f"{since} steps since merge < min_h {clock.min_h}")
        if since >= clock.max_h:
            return Decision(True, f"forced: {since} steps since merge >= max_h {clock.max_h}", forced=True)
        return self._decide(reports, signals, clock)

    @abstractmethod
    def _decide(self, reports: Sequence[LearnerReport], signals: FleetSignals, clock: ClockState) -> Decision: ...


class FixedH(Policy):
    name = "fixed_h"

    def __init__(self, h: int) -> None:
        self.h = h

    def _decide(self, reports, signals, clock):
        since = clock.steps_since_merge
        if since >= self.h:
            return Decision(True, f"{since} steps since merge >= h {self.h}")
        return Decision(False, f"{since} steps since merge < h {self.h}")


class PressureGate(Policy):
    name = "pressure_gate"

    def __init__(self, max_pressure: float) -> None:
        self.max_pressure = max_pressure

    def _decide(self, reports, signals, clock):
        p = signals.pressure
        if p <= self.max_pressure:
            return Decision(True, f"pressure {p:.2f} <= gate {self.max_pressure:.2f}", score=-p)
        return Decision(False, f"pressure {p:.2f} > gate {self.max_pressure:.2f}", score=-p)


class RandomDeferral(Policy):
    name = "random_deferral"

    def __init__(self, defer_prob: float, seed: int) -> None:
        self.defer_prob = defer_prob
        self.rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])

    def state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]

    def _decide(self, reports, signals, clock):
        u = float(self.rng.random())
        if u < self.defer_prob:
            return Decision(False, f"draw {u:.3f} < defer_prob {self.defer_prob:.2f}", score=u)
        return Decision(True, f"draw {u:.3f} >= defer_prob {self.defer_prob:.2f}", score=u)


class WaDiloco(Policy):
    """Workload-aware score; subclasses add penalty terms through `_penalties`."""

    name = "wa_diloco"

    def __init__(self, weights: ScoreWeights) -> None:
        self.w = weights

    def _terms(self, reports: Sequence[LearnerReport], signals: FleetSignals, clock: ClockState) -> dict[str, float]:
        progress = float(np.mean([r.relative_progress for r in reports])) if reports else 0.0
        progress = min(max(progress / self.w.progress_scale, 0.0), 1.0)
        terms = {
            "progress": self.w.w_progress * progress,
            "staleness": self.w.w_staleness * clock.staleness,
            "pressure": -self.w.w_pressure * signals.pressure,
        }
        terms.update(self._penalties(signals, clock))
        return terms

    def _penalties(self, signals: FleetSignals, clock: ClockState) -> dict[str, float]:
        return {}

    def _decide(self, reports, signals, clock):
        terms = self._terms(reports, signals, clock)
        score = sum(terms.values())
        detail = ", ".join(f"{k} {v:+.2f}" for k, v in terms.items())
        op = ">=" if score >= self.w.threshold else "<"
        return Decision(score >= self.w.threshold, f"score {score:.2f} {op} {self.w.threshold:.2f} ({detail})", score=score)


class WaCalibrated(WaDiloco):
    name = "wa_calibrated"

    def __init__(self, weights: ScoreWeights, w_cost: float, calibration: Calibration) -> None:
        super().__init__(weights)
        self.w_cost = w_cost
        self.calibration = calibration

    def _penalties(self, signals, clock):
        return {"serving_cost": -self.w_cost * self.calibration.expected_merge_cost(signals)}


class WaForecast(WaDiloco):
    """wa_diloco plus a forecast of fleet pressure over the coming merge window."""

    name = "wa_forecast"

    def __init__(
        self, weights: ScoreWeights, w_forecast: float, window_s: float, forecaster: EwmaForecaster | SeasonalForecaster
    ) -> None:
        super().__init__(weights)
        self.w_forecast = w_forecast
        self.window_s = window_s
        self.forecaster = forecaster

    def observe(self, samples):
        for s in samples:
            self.forecaster.observe(s.t_s, s.pressure)

    def state(self) -> dict[str, Any]:
        return {"forecaster": self.forecaster.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.forecaster.restore(state["forecaster"])

    def _penalties(self, signals, clock):
        return {"forecast": -self.w_forecast * self.forecaster.forecast(clock.t_s, self.window_s)}


class WaSeasonal(WaForecast):
    name = "wa_seasonal"


def build_policy(
    name: str, control: ControlConfig, merge: MergeConfig, seed: int, calibration: Calibration, grid_s: float
) -> Policy:
    """The policy `name` configured from params; `grid_s` is the signal sampling step.

    An ablated variant `<policy>-<term>` (config.ABLATABLE_TERMS) is the same class built with that term's
    weight at zero (`lookahead`: a horizon of one cycle) and carries the variant's name.
    """
    base, term = split_policy(name)
    if term is not None:
        control = _without(control, term)
    policy = _build(base, control, merge, seed, calibration, grid_s)
    policy.name = name
    return policy


def _without(control: ControlConfig, term: str) -> ControlConfig:
    """`control` with one score term switched off."""
    if term in ("progress", "staleness", "pressure"):
        return control.model_copy(update={"score": control.score.model_copy(update={f"w_{term}": 0.0})})
    if term == "forecast":
        return control.model_copy(update={"forecast": control.forecast.model_copy(update={"w_forecast": 0.0})})
    if term == "cost":
        return control.model_copy(update={"calibrated": control.calibrated.model_copy(update={"w_cost": 0.0})})
    if term == "lookahead":
        return control.model_copy(update={"lookahead": control.lookahead.model_copy(update={"horizon_cycles": 1})})
    raise ValueError(f"no ablation for term {term!r}")


def _build(
    name: str, control: ControlConfig, merge: MergeConfig, seed: int, calibration: Calibration, grid_s: float
) -> Policy:
    fc = control.forecast
    if name == "fixed_h":
        return FixedH(control.fixed_h.h)
    if name == "pressure_gate":
        return PressureGate(control.pressure_gate.max_pressure)
    if name == "random_deferral":
        return RandomDeferral(control.random_deferral.defer_prob, seed)
    if name == "wa_diloco":
        return WaDiloco(control.score)
    if name == "wa_calibrated":
        return WaCalibrated(control.score, control.calibrated.w_cost, calibration)
    if name == "wa_forecast":
        return WaForecast(control.score, fc.w_forecast, merge.window_s, EwmaForecaster(fc.ewma_alpha))
    if name == "wa_seasonal":
        seasonal = SeasonalForecaster(grid_s, fc.min_period_s, fc.max_period_s, fc.min_autocorr, fc.ewma_alpha)
        return WaSeasonal(control.score, fc.w_forecast, merge.window_s, seasonal)
    if name == "wa_lookahead":
        from syncsafe.control.lookahead import WaLookahead  # it builds on Policy, defined here

        seasonal = SeasonalForecaster(grid_s, fc.min_period_s, fc.max_period_s, fc.min_autocorr, fc.ewma_alpha)
        return WaLookahead(control.score, control.lookahead, calibration, merge.window_s, control.cycle_s, grid_s,
                           seasonal, EwmaForecaster(fc.ewma_alpha))
    raise ValueError(f"unknown policy {name!r}")
