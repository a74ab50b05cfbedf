"""The server profile and the plan made from it: a pure function of params and profile, checked against its inputs."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.calibration import model_json
from syncsafe.artifacts.schedule_sets import read_schedule_index
from syncsafe.config import load_params
from syncsafe.errors import BadInput
from syncsafe.schedules.stage import build_index, build_schedules
from syncsafe.realarm.capacity import TIME_SCALE_GRID, CapacityProbe, RegimeLoad, coarse_time_scale, load_scale
from syncsafe.realarm.capacity import LoadError, holdable_time_scale, load_shape
from syncsafe.realarm.plan import plan_real_arm
from syncsafe.realarm.server_profile import MeasuredServer, model_name, read_measured_server
from syncsafe.realarm.design import vllm_regimes
from syncsafe.realarm.replays import replay_vllm
from syncsafe.artifacts.traces import read_requests
from syncsafe.traces.stage import build_traces

PLACEMENT = {"mode": "split", "client_cpus": "1", "server_cpus": "0"}


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_raw):
    """The tiny profile's traces and harness schedules (no server, no training)."""
    raw = tiny_raw()
    raw["control"]["policies"] = ["fixed_h", "wa_seasonal"]
    raw["schedules"].update({"random_draws": 1, "source": "harness"})
    raw["analysis"]["primary"]["policy"] = "fixed_h"
    root = tmp_path_factory.mktemp("profiled")
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(root / "params.yaml")
    for regime in vllm_regimes(params):
        build_traces(params, regime, root)
        build_schedules(params, regime, root)
    build_index(params, root)
    return root, params


def measured_load(params, root, regime: str, capacity: float, noise_seed: int = 0) -> RegimeLoad:
    """A profile's load of `regime` at `capacity` req/s, scaled as the profile stage scales it."""
    cfg = params.replay.vllm
    arrivals = [read_requests(root, regime, s)["arrival_s"].to_numpy(dtype=float) for s in params.seeds]
    shape = load_shape(arrivals, params.merge.window_s, params.regimes[regime].duration_s)
    scale, peak_u, median_u = load_scale(regime, capacity, shape, cfg.target_utilisation, cfg.pinned_time_scale(regime))
    noise = np.random.default_rng(noise_seed).normal(0.0, 0.1, 200).tolist()
    return RegimeLoad(regime=regime, capacity_rps=capacity, ttft_bound_ms=300.0,
                      probes=[CapacityProbe(rate_rps=capacity, n_requests=100, ttft_p95_ms=90.0, failure_rate=0.0,
                                            sustained=True)],
                      peak_rate=shape.peak_rate, median_rate=shape.median_rate, window_s=params.merge.window_s,
                      time_scale=scale, time_scale_fixed=cfg.pinned_time_scale(regime) is not None,
                      target_utilisation=cfg.target_utilisation, utilisation=peak_u,
                      median_utilisation=median_u, noise_log_ratios=noise)


def plan_at(project, capacity: float, noise_seed: int = 0):
    root, params = project
    loads = {r: measured_load(params, root, r, capacity, noise_seed) for r in vllm_regimes(params)}
    return plan_real_arm(params, root, read_schedule_index(root), loads, None, PLACEMENT)


def test_the_plan_is_a_pure_function_of_params_and_profile(project):
    first, again = plan_at(project, 40.0), plan_at(project, 40.0)
    assert first == again, "the same params and profile give the same plan"
    assert "bursty" in first.regimes and first.regimes["bursty"].time_scale == first.loads["bursty"].time_scale


def test_two_profiles_of_one_grid_cell_give_the_same_plan(project):
    """Capacities that round onto one grid step (the profiles of one machine, a few % apart) plan alike."""
    root, params = project
    peak = measured_load(params, root, "bursty", 40.0).peak_rate
    scale = coarse_time_scale(0.7 * 40.0 / peak)
    mantissas = [m * 10.0 ** np.floor(np.log10(scale)) for m in (*TIME_SCALE_GRID, 10.0)]
    upper = next(m for m in mantissas if m > scale + 1e-9)
    low_cap, high_cap = scale * peak / 0.7, upper * peak / 0.7 * 0.999  # the cell's ends, in req/s
    rng = np.random.default_rng(7)
    plans = [plan_at(project, float(c), noise_seed=0) for c in rng.uniform(low_cap, high_cap, 3)]
    assert len({p.regimes["bursty"].time_scale for p in plans}) == 1
    assert all(p.regimes == plans[0].regimes and p.left_out == plans[0].left_out for p in plans)


DECISIONS = ("time_scale", "span_s", "fit_seeds", "held_out_seeds", "controllers", "draws", "controls",
             "expected_wall_s", "left_out")


def test_a_pinned_plan_is_the_same_on_a_machine_twice_as_slow_and_refused_naming_what_one_too_slow_holds(project):
    root, params = project
    shape = load_shape([read_requests(root, "bursty", s)["arrival_s"].to_numpy(dtype=float) for s in params.seeds],
                       params.merge.window_s, params.regimes["bursty"].duration_s)
    pinned_scale = holdable_time_scale(40.0, shape, 0.7)  # what the slower machine (40 req/s) holds
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["replay"]["vllm"].update({"time_scale": {"bursty": pinned_scale}, "span_s": {"bursty": 100.0}})
    (root / "pinned.yaml").write_text(yaml.safe_dump(raw))
    pinned = load_params(root / "pinned.yaml")
    plans = []
    for capacity, noise_seed in ((80.0, 0), (40.0, 1)):  # two machines of one kind, 2x apart, other noise
        loads = {r: measured_load(pinned, root, r, capacity, noise_seed) for r in vllm_regimes(pinned)}
        plans.append(plan_real_arm(pinned, root, read_schedule_index(root), loads, None, PLACEMENT))
    fast, slow = (p.regimes["bursty"] for p in plans)
    assert fast.time_scale == slow.time_scale == pinned_scale and fast.span_s == 100.0
    assert {k: getattr(fast, k) for k in DECISIONS} == {k: getattr(slow, k) for k in DECISIONS}
    assert plans[0].loads["bursty"].utilisation == pytest.approx(plans[1].loads["bursty"].utilisation / 2)
    # a machine that holds less is refused in one line, before any replay, naming the largest scale it holds
    too_slow = measured_load(pinned, root, "bursty", 40.0).model_copy(update={"capacity_rps": 20.0})
    holds = holdable_time_scale(20.0, shape, 0.7)
    with pytest.raises(LoadError, match=rf"regime bursty: the pinned replay.vllm.time_scale {pinned_scale:g} .*"
                                        rf"the largest time scale this machine holds is {holds:g}$"):
        plan_real_arm(pinned, root, read_schedule_index(root), {"bursty": too_slow}, None, PLACEMENT)
    with pytest.raises(LoadError, match=rf"holds is {holds:g}$"):  # and the profile itself refuses to measure on
        measured_load(pinned, root, "bursty", 20.0)


def write_profile(root, measured: MeasuredServer) -> None:
    io.write_text(layout.at(root, layout.VLLM_SERVER_FILE), model_json(measured))


def test_a_profile_of_another_model_or_load_target_is_refused_with_the_stage_to_rerun(project, tmp_path):
    root, params = project
    with pytest.raises(BadInput, match=r"runs/server-profile/server\.json.*profile-vllm"):
        read_measured_server(params, tmp_path)  # none written
    from syncsafe.realarm.arm import served_model

    model = model_name(served_model(params, tmp_path), tmp_path)
    loads = {r: measured_load(params, root, r, 40.0) for r in vllm_regimes(params)}
    write_profile(tmp_path, MeasuredServer(model="models/another", loads=loads))
    with pytest.raises(BadInput, match=r"measured for model models/another, this run serves"):
        read_measured_server(params, tmp_path)
    write_profile(tmp_path, MeasuredServer(model=model, loads={}))
    with pytest.raises(BadInput, match=r"no load measured for regime bursty"):
        read_measured_server(params, tmp_path)
    other = {r: load.model_copy(update={"target_utilisation": 0.5}) for r, load in loads.items()}
    write_profile(tmp_path, MeasuredServer(model=model, loads=other))
    with pytest.raises(BadInput, match=r"target_utilisation 0\.5.*params now differ"):
        read_measured_server(params, tmp_path)
    write_profile(tmp_path, MeasuredServer(model=model, loads=loads))
    assert read_measured_server(params, tmp_path).loads == loads


def test_the_replay_stage_refuses_to_start_without_a_profile(project):
    root, params = project
    with pytest.raises(BadInput, match=r"no server profile.*profile-vllm"):
        replay_vllm(params, root)
    assert not (root / "runs" / "replay-sets").exists(), "nothing written, no server started"


def test_real_arm_plan_sizes_what_to_pin_from_a_profile_and_a_budget(project):
    from typer.testing import CliRunner

    from syncsafe.cli import app
    from syncsafe.realarm.plan import pinned_params, size_from_profile

    root, params = project
    checked = {r: measured_load(params, root, r, 40.0) for r in vllm_regimes(params)}  # the tiny pin, checked
    write_profile(root, MeasuredServer(model="models/m", loads=checked, placement=PLACEMENT))
    try:
        with pytest.raises(BadInput, match=r"capacity was only checked at its pinned time scale 2 .*bursty: null"):
            size_from_profile(params, root, budget_s=600.0)
        loads = {r: load.model_copy(update={"time_scale_fixed": False}) for r, load in checked.items()}  # searched
        write_profile(root, MeasuredServer(model="models/m", loads=loads, placement=PLACEMENT))
        plan = size_from_profile(params, root, budget_s=600.0)
        load = loads["bursty"]
        holds = holdable_time_scale(40.0, load_shape_of(load), 0.7)
        assert plan.regimes["bursty"].time_scale == holds and plan.loads["bursty"].utilisation <= 0.7
        assert plan.regimes["bursty"].expected_wall_s <= 600.0
        pins = pinned_params(plan)
        assert pins == {"time_scale": {"bursty": holds}, "span_s": {"bursty": plan.regimes["bursty"].span_s}}
        result = CliRunner().invoke(app, ["real-arm", "plan", "--params", str(root / "params.yaml"), "--root",
                                          str(root), "--budget-s", "600"])
        assert result.exit_code == 0, result.output
        assert "to pin it" in result.output and f"bursty: {holds:g}" in result.output.replace(".0\n", "\n")
    finally:
        layout.at(root, layout.VLLM_SERVER_FILE).unlink()


def load_shape_of(load: RegimeLoad):
    from syncsafe.realarm.capacity import LoadShape

    return LoadShape(load.peak_rate, load.median_rate)
