"""Which schedules the real vLLM server replays, in which order, and which seeds fit or judge the simulator.

Default plan (`replay.vllm`): on every replayed seed, the declared primary
controller (`analysis.primary.policy`, plus any `policies`) with its first
`draws` matched-random draws, and the seed's no-sync schedule twice: first
(the SLO's source and every replay's twin) and last (the drift control of
the mechanism gate). The replays in between run in an order shuffled per
seed (seeded), so a slow drift of the server cannot line up with one kind of
schedule. Seeds split into `fit_seeds` (the calibrate-fit stage) and
`held_out_seeds` (the fidelity stage), never overlapping.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from syncsafe.config import Params
from syncsafe.traces.timeline import regime_rng

#: Seeds replayed when replay.vllm.seeds is null: one to fit, three held out.
DEFAULT_N_SEEDS = 4
ORDER_STREAM = "vllm-replay-order"


def vllm_controllers(params: Params) -> list[str]:
    """Controllers the vLLM replay covers: the declared primary first, then `replay.vllm.policies`."""
    out = [params.analysis.primary.policy]
    for policy in params.replay.vllm.policies or []:
        if policy not in out:
            out.append(policy)
    return out


def vllm_seeds(params: Params) -> list[int]:
    cfg = params.replay.vllm
    return list(cfg.seeds) if cfg.seeds else list(params.seeds[:DEFAULT_N_SEEDS])


def vllm_seed_split(params: Params) -> tuple[list[int], list[int]]:
    """(fit seeds, held-out seeds) of the vLLM replay (see the module docstring)."""
    cfg = params.replay.vllm
    seeds = vllm_seeds(params)
    fit = list(cfg.fit_seeds) if cfg.fit_seeds else seeds[:1]
    held = list(cfg.held_out_seeds) if cfg.held_out_seeds is not None else [s for s in seeds if s not in fit]
    return fit, [s for s in held if s not in fit]


def choose_schedules(params: Params, index: pd.DataFrame) -> pd.DataFrame:
    """The schedule-index rows the vLLM replay covers."""
    cfg = params.replay.vllm
    fit, held = vllm_seed_split(params)
    policies = vllm_controllers(params)
    return index[
        index["regime"].isin(cfg.regimes)
        & index["seed"].isin(fit + held)
        & (
            (index["source"] == "no_sync")
            | (index["policy"].isin(policies) & index["source"].isin(["train", "harness"]))
            | ((index["source"] == "matched_random") & index["matched_to"].isin(policies) & (index["draw"] < cfg.draws))
        )
    ]


def replay_order(regime: str, seed: int, rows: list[pd.Series], repeat_no_sync: bool) -> list[tuple[pd.Series, bool]]:
    """(row, is_repeat) in replay order: no-sync first, the rest shuffled (seeded), no-sync again last."""
    no_sync = [r for r in rows if r["source"] == "no_sync"]
    if len(no_sync) != 1:
        raise ValueError(f"{regime} seed {seed}: expected one no_sync schedule in the index, found {len(no_sync)}")
    rest = [r for r in rows if r["source"] != "no_sync"]
    rest = sorted(rest, key=lambda r: str(r["path"]))
    perm = regime_rng(regime, seed, ORDER_STREAM).permutation(len(rest))
    ordered = [(no_sync[0], False), *((rest[int(i)], False) for i in np.asarray(perm))]
    if repeat_no_sync:
        ordered.append((no_sync[0], True))
    return ordered
