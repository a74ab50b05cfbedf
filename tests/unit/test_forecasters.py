"""Forecasters: EWMA arithmetic and the seasonal forecaster's edge on periodic load."""

from __future__ import annotations

import numpy as np
import pytest

from syncsafe.config import BurstyRegime
from syncsafe.control.forecasters import EwmaForecaster, SeasonalForecaster
from syncsafe.control.types import FleetSignals
from syncsafe.traces.timeline import generate_timeline


def test_ewma_update_arithmetic():
    f = EwmaForecaster(0.25)
    assert f.forecast(0, 8) == 0.0
    f.observe(0, 1.0)
    assert f.forecast(0, 8) == 1.0  # first observation sets the level
    f.observe(1, 0.0)
    assert f.forecast(1, 8) == pytest.approx(0.75)
    f.observe(2, 2.0)
    assert f.forecast(2, 8) == pytest.approx(0.25 * 2.0 + 0.75 * 0.75)


def test_ewma_rejects_bad_alpha():
    with pytest.raises(ValueError):
        EwmaForecaster(0.0)


def _pressure(timeline):
    return [FleetSignals(**{k: getattr(r, k) for k in FleetSignals.__dataclass_fields__}).pressure
            for r in timeline.itertuples(index=False)]


def test_seasonal_detects_the_burst_period():
    tl = generate_timeline("bursty", BurstyRegime(kind="bursty", duration_s=600, phase_s=15), 0.5, seed=3)
    f = SeasonalForecaster(0.5, 20, 900, 0.5, 0.5)
    for t, x in zip(tl["t_s"], _pressure(tl)):
        f.observe(t, x)
    assert f.period_s() == pytest.approx(120, abs=1.0)


def test_seasonal_beats_ewma_on_bursty_load():
    tl = generate_timeline("bursty", BurstyRegime(kind="bursty", duration_s=900, phase_s=15), 0.5, seed=1)
    x = np.asarray(_pressure(tl))
    t = tl["t_s"].to_numpy()
    horizon, decide_every = 8.0, 1
    ewma, seasonal = EwmaForecaster(0.5), SeasonalForecaster(0.5, 20, 900, 0.5, 0.5)
    errors = {"ewma": [], "seasonal": []}
    for i in range(t.size - int(horizon / 0.5)):
        ewma.observe(t[i], x[i])
        seasonal.observe(t[i], x[i])
        if t[i] >= 300 and i % decide_every == 0:  # after two periods of history
            truth = x[i + 1 : i + 1 + int(horizon / 0.5)].mean()
            errors["ewma"].append(abs(ewma.forecast(t[i], horizon) - truth))
            errors["seasonal"].append(abs(seasonal.forecast(t[i], horizon) - truth))
    assert np.mean(errors["seasonal"]) < 0.7 * np.mean(errors["ewma"])


def test_seasonal_falls_back_to_ewma_without_a_period():
    rng = np.random.default_rng(0)
    f, e = SeasonalForecaster(1.0, 20, 900, 0.5, 0.3), EwmaForecaster(0.3)
    for i, v in enumerate(rng.random(400)):
        f.observe(float(i), float(v))
        e.observe(float(i), float(v))
    assert f.period_s() is None
    assert f.forecast(400, 8) == pytest.approx(e.forecast(400, 8))
