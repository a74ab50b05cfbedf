"""Replay against a real vLLM server (the `vllm` backend of the replay stage).

The plan comes first and touches no server: it is sized from params and the
server profile (`server_profile`, the profile-vllm stage) by
`plan.plan_real_arm`, written to `plan.json` and printed. Then one
server serves the whole stage run, with the merge work beside it on the
same CPUs and the client (this process) on CPUs of its own (`arm`):

1. warm-up (discarded) until the decode pace stops falling (`warmup`), so that
   the first replays do not meet a slower server than the last;
2. the replays: per regime, one block per seed (`design.block_order`): its
   no-sync controls interleaved with the controllers, their span-matched
   draws and span cadences; each one taken by `RealArm.replay` (busy
   machine, failures, late client, failing scraper, or a control overloaded
   against the profile's light-load TTFT bound: invalid). A finished block
   is kept (`blocks`): a campaign stopped mid-way and run again replays
   only the blocks it lacks; `blocks.json` says which were kept;
3. the checks of `evidence`: a regime whose controls drift with the
   replay order gets one more control per seed, then its seeds are left
   out (the extra controls are a block of their own); every replay is
   written with its seed's SLO pooled from all its controls, with bootstrap
   intervals of its p95 and SLO rate.

Latencies are real milliseconds; arrivals and windows stay in trace seconds.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.calibration import model_json, read_server_profile
from syncsafe.artifacts.schedule_sets import read_schedule_index
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.realarm.engine_profile import ServerProfile
from syncsafe.serving.placement import CpuPlacement
from syncsafe.artifacts.replay_sets import write_signals, write_windows
from syncsafe.realarm.arm import Measured, PhaseClock, PlannedReplay, RealArm, open_arm
from syncsafe.realarm.blocks import EXTRA_CONTROLS, Block, load_block, make_block, model_digest, prune_blocks, save_block
from syncsafe.realarm.evidence import ControlTest, control_spread, controls_drift, pooled_slo, replay_intervals
from syncsafe.realarm.plan import describe_plan, plan_real_arm
from syncsafe.serving.replay import index_row, write_replay, write_set_index
from syncsafe.realarm.server_profile import read_measured_server
from syncsafe.realarm.design import RealPlan


def replay_vllm(params: Params, root: Path = Path(".")) -> pd.DataFrame:
    """Plan from the server profile, then replay the plan against one real vLLM server; return the replay index."""
    cfg = params.replay.vllm
    root = Path(root)
    out_root = layout.at(root, layout.VLLM_SET)
    if not cfg.enabled:  # an empty set: calibrate then records that nothing was measured on a real server
        io.write_text(out_root / layout.PLAN_FILE, model_json(RealPlan(notes=["replay.vllm.enabled is false"])))
        write_set_index(out_root / layout.REPEATS_FILE, [])
        return write_set_index(out_root / layout.INDEX_FILE, [])
    index = read_schedule_index(root)
    measured = read_measured_server(params, root)
    plan = plan_real_arm(params, root, index, measured.loads, read_server_profile(root, ServerProfile),
                         CpuPlacement.split(cfg.client_cpus).record())
    for line in describe_plan(plan):
        tqdm.write(f"replay vllm: {line}")
    rows: list[dict] = []
    repeats: list[dict] = []
    clock = PhaseClock("replay vllm")
    with open_arm(params, root, layout.VLLM_SERVER_LOG) as arm:
        warmup = arm.warm_up()
        if warmup is not None:
            plan = plan.model_copy(update={"notes": [*plan.notes, warmup.describe()], "warmup": warmup})
        clock.lap("server start and warm-up")
        io.write_text(out_root / layout.PLAN_FILE, model_json(plan))
        planned = {regime: arm.planned(p, index) for regime, p in plan.regimes.items()}
        total = sum(len(items) for items in planned.values())
        blocks: list[tuple[Block, bool]] = []
        with tqdm(total=total, desc="replay vllm", unit="replay", leave=False) as bar:
            for regime, items in planned.items():
                results, regime_blocks = replay_regime(arm, plan, regime, items, bar)
                blocks += regime_blocks
                for m, row in zip(results, write_regime(params, root, results)):
                    (repeats if m.item.control else rows).append(row)
        clock.lap("replays")
    io.write_json(out_root / layout.BLOCKS_FILE, {"blocks": [block.record(resumed) for block, resumed in blocks]})
    prune_blocks(root, [block for block, _ in blocks])
    write_set_index(out_root / layout.REPEATS_FILE, repeats)
    return write_set_index(out_root / layout.INDEX_FILE, rows)


def replay_regime(arm: RealArm, plan: RealPlan, regime: str, items: list[PlannedReplay], bar: tqdm
                  ) -> tuple[list[Measured], list[tuple[Block, bool]]]:
    """The regime's planned replays in order, block by block (`blocks`: a finished block kept from an earlier
    run is taken as it is), then the noise floor (`evidence.controls_drift`): when the controls' p95 follows
    the replay order (p < `control_alpha`) every seed gets one more control (a block of its own), and the
    regime's seeds are left out (every replay marked invalid, with the reason) when the test with them still
    says so. Returns the measured replays and the blocks in order, each with whether it was kept."""
    cfg, root = arm.cfg, arm.root
    regime_plan = plan.regimes[regime]
    load = plan.loads.get(regime)
    utilisation, bound = (load.utilisation, load.ttft_bound_ms) if load is not None else (0.0, None)
    inputs = {}
    for seed in regime_plan.seeds:
        requests = read_requests(root, regime, seed)
        inputs[seed] = (requests[requests["arrival_s"] < regime_plan.span_s].reset_index(drop=True),
                        read_timeline(root, regime, seed))
    blocks: list[tuple[Block, bool]] = []
    measured: list[Measured] = []

    weights = model_digest(arm.model)

    def run(label: str, block_items: list[PlannedReplay]) -> list[Measured]:
        block = make_block(arm.params, root, plan, regime, label, block_items, inputs, weights)
        kept = load_block(root, block)
        blocks.append((block, kept is not None))
        if kept is not None:
            tqdm.write(f"replay vllm: {regime} {label}: finished block kept from an earlier run ({len(kept)} replays)")
            bar.update(len(kept))
            return kept
        done = []
        for item in block.items:
            done.append(arm.replay(item, *inputs[int(item.row["seed"])], regime_plan, utilisation, bound))
            bar.update()
        save_block(root, block, done)
        return done

    for seed, block_items in itertools.groupby(items, key=lambda item: int(item.row["seed"])):  # contiguous
        measured += run(layout.seed_dirname(seed), list(block_items))
    test = _control_test(cfg, regime, measured)
    if test is not None and not test.can_detect(cfg.control_alpha):
        tqdm.write(f"replay vllm: {regime}: drift not checkable, {test.describe()} is not below control_alpha "
                   f"{cfg.control_alpha:g}")
    if test is not None and test.disagree(cfg.control_alpha):
        tqdm.write(f"replay vllm: {regime}: {test.describe()} < control_alpha {cfg.control_alpha:g}; one more "
                   "control per seed")
        extra = []
        for seed in regime_plan.seeds:
            first = next(m.item for m in measured if m.seed == seed and m.item.control is not None)
            controls = sum(m.seed == seed and m.item.control is not None for m in measured)
            extra.append(arm.planned_replay(first.row, controls, len(measured) + len(extra), regime_plan.controls))
        bar.total += len(extra)
        measured += run(EXTRA_CONTROLS, extra)
        test = _control_test(cfg, regime, measured)
        if test is not None and test.disagree(cfg.control_alpha):
            why = f"the {test.describe()} < control_alpha {cfg.control_alpha:g}: the server drifted over the run"
            measured = [m.invalid(f"noise floor: seed {m.seed} left out, {why}") for m in measured]
            tqdm.write(f"replay vllm: {regime}: noise floor, every seed left out: {test.describe()}")
    decided = _p_of(test)
    return [m.with_fields(control_p=decided) for m in measured], blocks


def _control_test(cfg, regime: str, measured: list[Measured]) -> ControlTest | None:
    """The drift test of the regime's valid no-sync controls at their replay positions, seeded per regime and
    control count."""
    valid: dict[int, list[tuple[int, pd.DataFrame]]] = {}
    for position, m in enumerate(measured):
        if m.item.control is not None and m.extra["valid"]:
            valid.setdefault(m.seed, []).append((position, m.results))
    count = sum(len(v) for v in valid.values())
    return controls_drift(valid, cfg.bootstrap_resamples, (count, *regime.encode()))


def write_regime(params: Params, root: Path, measured: list[Measured]) -> list[dict]:
    """Write every replay of a regime with its seed's SLO pooled from its valid controls (all its controls
    when none is valid), its bootstrap intervals and those controls' spread (the noise test's p that decided
    comes with each replay: `control_p`); their index rows, in order."""
    cfg = params.replay.vllm
    per_seed = {}
    for seed in dict.fromkeys(m.seed for m in measured):  # once per seed: SLO, spread, valid controls
        controls = [c for c in measured if c.seed == seed and c.item.control is not None]
        valid = [c.results for c in controls if c.extra["valid"]]
        pooled = valid or [c.results for c in controls]
        per_seed[seed] = (pooled_slo(params, pooled),
                          {"slo_controls": len(valid), "control_spread": control_spread(pooled)})
    rows = []
    for m in measured:
        slo, seed_fields = per_seed[m.seed]
        intervals = replay_intervals(m.results, slo, cfg.bootstrap_resamples, (m.seed, m.item.position, 0x5C1))
        write_signals(m.item.out, m.signals)
        write_windows(m.item.out, m.windows)
        summary = write_replay(m.item.out, m.results, slo, params, {**m.extra, **intervals, **seed_fields})
        row = index_row(m.item.row, "vllm", m.item.schedule, summary, m.item.out, root)
        row["schedule"] = m.item.row["path"]
        rows.append(row)
    return rows


def _p_of(test: ControlTest | None) -> float | None:
    return None if test is None else test.p_value


__all__ = ["replay_regime", "replay_vllm", "write_regime"]
