"""Online forecasters of fleet pressure over the coming merge window.

Both take irregular observations `(t_s, value)` as they arrive and answer
`forecast(t_s, horizon_s)`: the expected mean value over `[t_s, t_s + horizon_s)`.

- `EwmaForecaster`: one-step exponentially weighted moving average (the
  forecast is the smoothed level, whatever the horizon).
- `SeasonalForecaster`: finds the load's period by autocorrelation of the
  observed history and forecasts the window as the current level plus the
  change seen at the same phase of earlier periods; falls back to EWMA while
  no period is clear. On periodic (bursty)
  load it sees a burst coming, which EWMA, always lagging, cannot.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class EwmaForecaster:
    """f <- alpha * x + (1 - alpha) * f; the first observation sets f."""

    def __init__(self, alpha: float) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.level: float | None = None

    def observe(self, t_s: float, value: float) -> None:
        self.level = value if self.level is None else self.alpha * value + (1 - self.alpha) * self.level

    def forecast(self, t_s: float, horizon_s: float) -> float:
        return 0.0 if self.level is None else self.level

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to forecast on as if never stopped (JSON-able)."""
        return {"level": self.level}

    def restore(self, state: dict[str, Any]) -> None:
        self.level = state["level"]


class SeasonalForecaster:
    """Seasonal-naive forecast on a detected period, EWMA until a period is found."""

    def __init__(
        self,
        grid_s: float,
        min_period_s: float,
        max_period_s: float,
        min_autocorr: float,
        ewma_alpha: float,
    ) -> None:
        self.grid_s = grid_s
        self.min_period_s = min_period_s
        self.max_period_s = max_period_s
        self.min_autocorr = min_autocorr
        self.fallback = EwmaForecaster(ewma_alpha)
        self._t: list[float] = []
        self._x: list[float] = []

    def observe(self, t_s: float, value: float) -> None:
        self._t.append(t_s)
        self._x.append(value)
        self.fallback.observe(t_s, value)

    def state(self) -> dict[str, Any]:
        """The observed history and the fallback's level (JSON-able)."""
        return {"t": list(self._t), "x": list(self._x), "fallback": self.fallback.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self._t, self._x = [float(v) for v in state["t"]], [float(v) for v in state["x"]]
        self.fallback.restore(state["fallback"])

    def _grid_history(self) -> np.ndarray:
        """History resampled on a fixed grid by holding the last observation."""
        t = np.asarray(self._t)
        grid = np.arange(t[0], t[-1] + self.grid_s / 2, self.grid_s)
        idx = np.searchsorted(t, grid, side="right") - 1
        return np.asarray(self._x)[idx]

    def period_s(self) -> float | None:
        """The detected period, or None while the history shows none clearly."""
        if len(self._t) < 4:
            return None
        x = self._grid_history()
        x = x - x.mean()
        n = x.size
        lo = max(1, int(round(self.min_period_s / self.grid_s)))
        hi = min(int(round(self.max_period_s / self.grid_s)), n // 2)
        if hi < lo or not np.any(x):
            return None
        spectrum = np.fft.rfft(x, 2 * n)
        acov = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
        acf = acov / acov[0] * n / (n - np.arange(n))  # unbiased: correct for fewer overlapping pairs
        window = acf[lo - 1 : hi + 2] if hi + 2 <= n else np.append(acf[lo - 1 : hi + 1], -np.inf)
        inner = window[1:-1]
        peaks = np.flatnonzero((inner >= window[:-2]) & (inner >= window[2:]) & (inner >= self.min_autocorr))
        if peaks.size == 0:
            return None
        # Multiples of the period correlate about as well: take the first peak near the best.
        best = inner[peaks].max()
        first = peaks[np.argmax(inner[peaks] >= 0.9 * best)]
        return (lo + int(first)) * self.grid_s

    def forecast(self, t_s: float, horizon_s: float) -> float:
        """Current level plus the change the same phase of earlier periods saw.

        x(t..t+h) ~ x(t) + mean_k [x(t-kP..t-kP+h) - x(t-kP)], k = 1..3: the
        level follows this period's intensity, the shape (a burst starting or
        ending) comes from the history.
        """
        period = self.period_s()
        if period is None:
            return self.fallback.forecast(t_s, horizon_s)
        t = np.asarray(self._t)
        x = np.asarray(self._x)
        deltas = []
        for k in (1, 2, 3):
            lo, hi = t_s - k * period, t_s - k * period + horizon_s
            if lo < t[0]:
                break
            at = int(np.searchsorted(t, lo, side="right")) - 1  # observation in force at lo
            last = int(np.searchsorted(t, hi, side="left"))
            deltas.append(float(x[at : max(last, at + 1)].mean() - x[at]))
        if not deltas:
            return self.fallback.forecast(t_s, horizon_s)
        return float(np.clip(x[-1] + np.mean(deltas), x.min(), x.max()))
