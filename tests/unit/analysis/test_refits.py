"""Refits of the calibration on fit replays shocked at the server's wander (`analysis.calibration.refits`)."""

from __future__ import annotations

import numpy as np
import pytest

from syncsafe.analysis.calibration.records import ReplayRecord
from syncsafe.analysis.calibration.refits import refit_calibrations, shocked, shocked_profile
from syncsafe.control.serving_model import Calibration
from syncsafe.realarm.engine_profile import ServerProfile, profile_prior
from syncsafe.realarm.gate import ReplayNoise

from test_calibrate import make_records, truth_profile


@pytest.fixture(scope="module")
def fit_records() -> list[ReplayRecord]:
    return [r for r in make_records(seeds=(0,)) if r.seed == 0]


def _level_fit(records: list[ReplayRecord], profile: ServerProfile | None = None) -> Calibration:
    """A stand-in fit: the records' mean log E2E as the iteration cost, the profile's decode slope as its
    per-sequence cost (what the refits move is the inputs)."""
    logs = np.concatenate([np.log(r.results["e2e_ms"].to_numpy(dtype=float)) for r in records])
    prior = profile_prior(profile, Calibration())[0] if profile is not None else Calibration()
    return Calibration(iter_base_ms=float(np.exp(logs.mean())) / 100.0, decode_ms_per_seq=prior.decode_ms_per_seq)


def test_a_profile_shock_multiplies_every_probe_s_latencies_so_the_prior_s_costs_scale():
    profile = truth_profile()
    out = shocked_profile(profile, np.log(2.0))
    for before, after in zip(profile.rows, out.rows):
        for name in ("itl_ms", "prefill_ms", "ttft_ms"):
            old, new = getattr(before, name), getattr(after, name)
            assert (old is None and new is None) or new == pytest.approx(2.0 * old)
        assert after.concurrency == before.concurrency and after.merge == before.merge
    prior, shocked_prior = profile_prior(profile, Calibration())[0], profile_prior(out, Calibration())[0]
    assert shocked_prior.decode_ms_per_seq == pytest.approx(2.0 * prior.decode_ms_per_seq)
    assert shocked_prior.merge_compute_share == pytest.approx(prior.merge_compute_share), "a ratio: unchanged"
    assert shocked_profile(None, 1.0) is None


def test_a_shock_multiplies_the_latencies_and_nothing_else(fit_records):
    rec = fit_records[0]
    out = shocked(rec, np.log(1.5))
    assert np.allclose(out.results["e2e_ms"], rec.results["e2e_ms"] * 1.5)
    assert np.allclose(out.results["ttft_ms"], rec.results["ttft_ms"] * 1.5)
    rest = [c for c in rec.results.columns if c not in ("e2e_ms", "ttft_ms")]
    assert out.results[rest].equals(rec.results[rest]) and out.schedule == rec.schedule
    assert rec.results["e2e_ms"].equals(make_records(seeds=(0,))[0].results["e2e_ms"]), "the input is untouched"


def test_refits_spread_as_the_wander_says_are_seeded_and_count_failures(fit_records):
    noise = ReplayNoise(var=0.1 ** 2, df=8)
    refits = refit_calibrations(fit_records, truth_profile(), _level_fit, noise, 40, seed=3)
    assert len(refits.calibrations) == 40 and refits.failed == 0
    assert (refits.replay_sd, refits.replay_sd_df, refits.seed) == (pytest.approx(0.1), 8, 3)
    levels = np.log([c.iter_base_ms for c in refits.calibrations])
    # every replay shocked on its own: the mean log latency moves by about sd / sqrt(replays)
    expected = 0.1 / np.sqrt(len(fit_records))
    assert 0.5 * expected < levels.std() < 2.0 * expected
    assert abs(levels.mean() - np.log(_level_fit(fit_records).iter_base_ms)) < 3 * expected / np.sqrt(40)
    # the profile takes one shock of its own per refit: its prior moves by about the whole sd
    slopes = np.log([c.decode_ms_per_seq for c in refits.calibrations])
    assert 0.5 * 0.1 < slopes.std() < 2.0 * 0.1
    again = refit_calibrations(fit_records, truth_profile(), _level_fit, noise, 40, seed=3)
    assert again.calibrations == refits.calibrations
    assert refit_calibrations(fit_records, truth_profile(), _level_fit, noise, 40, seed=4).calibrations != refits.calibrations

    calls = iter(range(100))

    def flaky(records: list[ReplayRecord], profile: ServerProfile | None) -> Calibration:
        if next(calls) % 2:
            raise ValueError("too little data")
        return _level_fit(records, profile)

    some = refit_calibrations(fit_records, None, flaky, noise, 6, seed=3)
    assert len(some.calibrations) == 3 and some.failed == 3
