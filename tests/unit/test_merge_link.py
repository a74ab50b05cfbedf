"""The merge link model: the all-reduce cost arithmetic, its fit, and how the calibrated policies use it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from syncsafe.control.merge_link import (LinkMeasurement, MergeLink, allreduce_bytes, fit_merge_link,
                                         model_comm_s)
from syncsafe.control.serving_model import Calibration, CalibrationError, policy_calibration
from syncsafe.control.types import FleetSignals

PAYLOAD = 2_361_860


def test_a_ring_all_reduce_sends_2n_w_minus_1_over_w_bytes_per_island():
    assert allreduce_bytes(1000, 2) == 1000
    assert allreduce_bytes(1000, 4) == 1500
    assert allreduce_bytes(1000, 1) == 0
    # 2.36 MB at 20 Mbit/s between two islands: 0.945 s on the wire, plus one delay per ring step
    assert model_comm_s(PAYLOAD, 2, 20.0) == pytest.approx(8 * PAYLOAD / 20e6)
    assert model_comm_s(PAYLOAD, 2, 20.0, delay_ms=5) == pytest.approx(8 * PAYLOAD / 20e6 + 0.010)
    assert model_comm_s(PAYLOAD, 2, None) == 0.0


def test_the_fit_recovers_the_fixed_cost_and_the_link_efficiency():
    rng = np.random.default_rng(0)
    fixed, efficiency = 0.006, 0.83
    measured = [LinkMeasurement(rate_mbit=r, merge_s=list(fixed + model_comm_s(PAYLOAD, 2, r) / efficiency
                                                          * (1 + rng.normal(0, 0.01, 7))))
                for r in (10, 20, 50, 200)] + [LinkMeasurement(rate_mbit=None, merge_s=[0.006] * 7)]
    link = fit_merge_link(measured, PAYLOAD, 2, link_mbit=200)
    assert link.fixed_s == pytest.approx(fixed, abs=0.01)
    assert link.efficiency == pytest.approx(efficiency, rel=0.03)
    assert link.measured == measured  # the evidence travels with the model
    # free link: fixed + wire time at the effective rate; half the link taken: the wire time doubles
    assert link.merge_s(0) == pytest.approx(link.fixed_s + model_comm_s(PAYLOAD, 2, 200 * link.efficiency))
    wire = link.merge_s(0) - link.fixed_s
    assert link.merge_s(0.5) == pytest.approx(link.fixed_s + 2 * wire)
    assert link.duration_factor(0.0) == 1.0 and link.duration_factor(0.5) > 1.9
    assert link.merge_s(1.0) == link.merge_s(0.95) < float("inf")  # a full link is capped, not endless


def test_a_fit_needs_two_rates_and_a_link_bound_merge():
    with pytest.raises(ValueError, match="two or more link rates"):
        fit_merge_link([LinkMeasurement(rate_mbit=20, merge_s=[1.0]), LinkMeasurement(rate_mbit=None, merge_s=[0.1])],
                       PAYLOAD, 2, 20)
    flat = [LinkMeasurement(rate_mbit=r, merge_s=[0.5 + r / 100]) for r in (10, 50)]  # slower on the faster link
    with pytest.raises(ValueError, match="not the bottleneck"):
        fit_merge_link(flat, PAYLOAD, 2, 50)


def _signals(network_pressure: float) -> FleetSignals:
    return FleetSignals(t_s=0.0, busy=True, arrival_rate=4.0, inference_pressure=0.5,
                        network_pressure=network_pressure, checkpoint_pressure=0.0)


def test_the_expected_merge_cost_grows_with_network_pressure_only_with_a_link_model():
    plain = Calibration()
    assert plain.expected_merge_cost(_signals(0.0)) == plain.expected_merge_cost(_signals(0.8)) > 0
    link = MergeLink(payload_bytes=PAYLOAD, islands=2, link_mbit=20, fixed_s=0.01, efficiency=0.8)
    priced = Calibration(merge_link=link)
    assert priced.expected_merge_cost(_signals(0.0)) == pytest.approx(plain.expected_merge_cost(_signals(0.0)))
    assert priced.expected_merge_cost(_signals(0.5)) == pytest.approx(
        plain.expected_merge_cost(_signals(0.5)) * link.duration_factor(0.5))


def test_the_policies_calibration_carries_the_named_link_model(tmp_path):
    link = MergeLink(payload_bytes=PAYLOAD, islands=2, link_mbit=50, fixed_s=0.01, efficiency=0.8)
    path = tmp_path / "merge_link.json"
    path.write_text(link.model_dump_json())
    assert policy_calibration(None, None) == Calibration()
    assert policy_calibration(None, path).merge_link == link
    path.write_text(json.dumps({"payload_bytes": PAYLOAD}))
    with pytest.raises(CalibrationError, match="merge_link.json"):
        policy_calibration(None, path)
    with pytest.raises(CalibrationError, match="bench_merge_link"):
        policy_calibration(None, tmp_path / "missing.json")
