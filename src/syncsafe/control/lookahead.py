"""`wa_lookahead`: merge now only if now is the cheapest feasible start, from past observations only.

The feasible starts are the control cycles ahead until the forced merge:
k = 0 (now), 1, ..., K where cycle k starts at t + k * C (C = min_h * step_s
trace seconds) and K = (max_h - steps_since_merge) / min_h, the cycle at which
a merge is forced. The policy prices a merge window [t + k C, t + k C + W)
(W = merge window) and decides by backward induction over k (optimal
stopping):

    cost series   x(t) = Calibration.expected_merge_cost(signals at t), every
                  observed fleet sample; c(t) = its mean over [t, t + W)
                  (the window's cost), known for windows already past
    statistics    over the last `history_s`: mean mu, spread sigma,
                  autocorrelation rho(h) of c at each lag h = k C
    forecast      m_k = seasonal analog when the SeasonalForecaster finds a
                  period P: level + mean_j [c(t + kC - jP) - x(t - jP)], j = 1..3;
                  otherwise mean reversion: m_k = mu + (level - mu) * rho(kC),
                  level = the EwmaForecaster's smoothed x
    spread        s_k = sigma * sqrt(1 - rho(kC)^2) (the part of the future
                  the past does not predict), shaped by the empirical
                  standardised distribution of c
    deferral      d_k = k * w_defer * sigma * (w_progress * progress +
                  w_staleness * staleness): wa_diloco's learner-progress and
                  staleness terms, the cost of holding back a merge per cycle
    induction     V_K = m_K + d_K (forced); V_k = E[min(m_k + s_k Z + d_k, V_{k+1})]
    decision      merge now iff m_0 <= V_1.

Everything is computed from samples the controller has already shown the
policy (`observe`), so a change to the trace after t never changes a decision
made before t.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from syncsafe.config import LookaheadConfig, ScoreWeights
from syncsafe.control.forecasters import EwmaForecaster, SeasonalForecaster
from syncsafe.control.policies import Policy
from syncsafe.control.types import ClockState, Decision, FleetSignals, LearnerReport
from syncsafe.control.serving_model import Calibration

#: Standardised quantile points the expectations are taken over.
_N_QUANTILES = 33


class WaLookahead(Policy):
    name = "wa_lookahead"

    def __init__(
        self,
        weights: ScoreWeights,
        cfg: LookaheadConfig,
        calibration: Calibration,
        window_s: float,
        cycle_s: float,
        grid_s: float,
        seasonal: SeasonalForecaster,
        level: EwmaForecaster,
    ) -> None:
        self.w = weights
        self.cfg = cfg
        self.calibration = calibration
        self.window_s = window_s
        self.cycle_s = cycle_s
        self.grid_s = grid_s
        self.seasonal = seasonal
        self.level = level
        #: Period detection (an FFT of the history) is refreshed after this much new history.
        self._period_every_s = max(cycle_s, 60.0)
        self._period: float | None = None
        self._period_at: float | None = None
        self._t: deque[float] = deque(maxlen=max(4, int(round(cfg.history_s / grid_s))))
        self._x: deque[float] = deque(maxlen=self._t.maxlen)

    # ------------------------------------------------------------------ observations

    def observe(self, samples: Sequence[FleetSignals]) -> None:
        for s in samples:
            cost = self.calibration.expected_merge_cost(s)
            self._t.append(s.t_s)
            self._x.append(cost)
            self.seasonal.observe(s.t_s, cost)
            self.level.observe(s.t_s, cost)

    def state(self) -> dict[str, Any]:
        return {"seasonal": self.seasonal.state(), "level": self.level.state(), "period": self._period,
                "period_at": self._period_at, "t": list(self._t), "x": list(self._x)}

    def restore(self, state: dict[str, Any]) -> None:
        self.seasonal.restore(state["seasonal"])
        self.level.restore(state["level"])
        self._period, self._period_at = state["period"], state["period_at"]
        self._t.clear()
        self._t.extend(float(v) for v in state["t"])
        self._x.clear()
        self._x.extend(float(v) for v in state["x"])

    def _window_costs(self, x: np.ndarray) -> np.ndarray:
        """c[i] = mean of x over the merge window starting at sample i (complete windows only)."""
        w = max(1, int(round(self.window_s / self.grid_s)))
        if x.size < w:
            return np.empty(0)
        csum = np.concatenate([[0.0], np.cumsum(x)])
        return (csum[w:] - csum[:-w]) / w

    # ------------------------------------------------------------------ forecasts

    def candidate_costs(
        self, t_s: float, n_ahead: int, x: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, float, str]:
        """Forecast mean and spread of the merge cost at cycles k = 0..n_ahead, the spread sigma, and the method.

        `x`: the cost samples of the history; `c`: their window means (`_window_costs(x)`).
        """
        level = self.level.forecast(t_s, self.window_s)
        k = np.arange(n_ahead + 1)
        if c.size < 2:
            return np.full(k.size, level), np.zeros(k.size), 0.0, "no history"
        mu, sigma = float(c.mean()), float(c.std())
        lags = np.rint(k * self.cycle_s / self.grid_s).astype(int)
        rho = np.array([self._autocorr(c, lag, mu, sigma) for lag in lags])
        spread = sigma * np.sqrt(np.clip(1.0 - rho**2, 0.0, 1.0))
        period = self._detected_period()
        if period is not None:
            mean = self._seasonal_means(x, c, level, lags, period)
            if mean is not None:
                return mean, spread, sigma, f"seasonal P={period:g}s"
        return mu + (level - mu) * rho, spread, sigma, "mean reversion"

    def _detected_period(self) -> float | None:
        """The seasonal forecaster's period, re-detected once `_period_every_s` of new samples arrived."""
        last = self._t[-1] if self._t else None
        if last is not None and (self._period_at is None or last - self._period_at >= self._period_every_s):
            self._period, self._period_at = self.seasonal.period_s(), last
        return self._period

    @staticmethod
    def _autocorr(c: np.ndarray, lag: int, mu: float, sigma: float) -> float:
        if lag == 0:
            return 1.0
        if sigma <= 0 or lag >= c.size - 1:
            return 0.0
        a, b = c[:-lag] - mu, c[lag:] - mu
        return float(np.clip(np.mean(a * b) / sigma**2, 0.0, 1.0))

    def _seasonal_means(
        self, x: np.ndarray, c: np.ndarray, level: float, lags: np.ndarray, period_s: float
    ) -> np.ndarray | None:
        """level + mean_j [c(now + lag - jP) - x(now - jP)] over the periods the history holds."""
        p = int(round(period_s / self.grid_s))
        now = x.size - 1
        means = []
        for lag in lags:
            deltas = [c[now + lag - j * p] - x[now - j * p]
                      for j in (1, 2, 3) if now - j * p >= 0 and 0 <= now + lag - j * p < c.size]
            if not deltas:
                return None
            means.append(level + float(np.mean(deltas)))
        return np.maximum(np.asarray(means), 0.0)

    @staticmethod
    def _standard_shape(c: np.ndarray) -> np.ndarray:
        """Standardised quantiles of the window costs seen (the shape of their distribution)."""
        if c.size < 2 or c.std() <= 0:
            return np.zeros(1)
        q = np.quantile(c, (np.arange(_N_QUANTILES) + 0.5) / _N_QUANTILES)
        return (q - c.mean()) / c.std()

    # ------------------------------------------------------------------ decision

    def _deferral_per_cycle(self, reports: Sequence[LearnerReport], clock: ClockState, sigma: float) -> float:
        progress = float(np.mean([r.relative_progress for r in reports])) if reports else 0.0
        progress = min(max(progress / self.w.progress_scale, 0.0), 1.0)
        value = self.w.w_progress * progress + self.w.w_staleness * clock.staleness
        return self.cfg.w_defer * sigma * value

    def plan(
        self, reports: Sequence[LearnerReport], t_s: float, clock: ClockState
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """Cost of merging at each feasible cycle k (forecast + deferral) and V_k, the value of waiting until k."""
        n_ahead = max(0, (clock.max_h - clock.steps_since_merge) // clock.min_h)
        if self.cfg.horizon_cycles is not None:
            n_ahead = min(n_ahead, self.cfg.horizon_cycles)
        x = np.fromiter(self._x, dtype=float, count=len(self._x))
        c = self._window_costs(x)
        mean, spread, sigma, method = self.candidate_costs(t_s, n_ahead, x, c)
        cost = mean + np.arange(n_ahead + 1) * self._deferral_per_cycle(reports, clock, sigma)
        z = self._standard_shape(c)
        value = np.empty(n_ahead + 1)
        value[-1] = cost[-1]  # the forced merge: whatever that cycle costs
        for k in range(n_ahead - 1, -1, -1):
            value[k] = float(np.mean(np.minimum(cost[k] + spread[k] * z, value[k + 1]))) if k else cost[0]
        return cost, value, method

    def _decide(self, reports, signals, clock):
        cost, value, method = self.plan(reports, clock.t_s, clock)
        if cost.size == 1:
            return Decision(True, f"no later cycle before max_h ({method})", score=0.0)
        margin = float(value[1] - cost[0])
        ahead = ", ".join(f"{v:.3f}" for v in cost[1:])
        op = ">=" if margin >= 0 else "<"
        reason = f"now {cost[0]:.3f} vs wait {value[1]:.3f} (margin {margin:+.3f} {op} 0; ahead {ahead}; {method})"
        return Decision(margin >= 0, reason, score=margin)
