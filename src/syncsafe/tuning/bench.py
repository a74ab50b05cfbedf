"""One seed's bench: a controller's schedule scored against matched random and the SLO oracle, in the simulator.

The same measures as the pipeline's protocol (`analysis.protocol`), on the
stress harness's learner-progress model so that hundreds of knob settings
cost seconds: per seed, the SLO comes from the simulated no-sync replay
(`serving.replay.resolve_slo`), a schedule's score is its simulated SLO
violations, and for its merge count n

- *matched random* is the mean over `draws` draws from the controller's own
  action space (`schedules.derive.matched_random`),
- the *oracle* is `serving.oracle.slo_oracle` for that count, started from
  those draws; any schedule of that count the bench has scored is a
  feasible candidate too, so the oracle is the best of them all,
- *gap closed* = (random - schedule) / (random - oracle), undefined when
  random sits less than one request above the oracle.

Draws and oracle are cached per count; the calibration and time scale are
the pipeline's (`simulator_calibration`, the real arm's plan when one exists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from syncsafe.config import Params
from syncsafe.control.serving_model import Calibration, simulator_calibration
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.derive import matched_random, no_sync
from syncsafe.schedules.schedule import Schedule
from syncsafe.schedules.stage import run_harness
from syncsafe.serving.metrics import SloSpec, violation_mask
from syncsafe.serving.oracle import slo_oracle
from syncsafe.realarm.design import simulator_time_scale
from syncsafe.serving.replay import resolve_slo
from syncsafe.serving.simulator import simulate_at_time_scale

#: A gap below this many violated requests leaves gap closed undefined (as the protocol's floor).
MIN_GAP_REQUESTS = 1.0


@dataclass(frozen=True)
class Scored:
    """One schedule on one seed: its violations and the references of its merge count."""

    seed: int
    n_merges: int
    violations: int
    random_mean: float
    oracle: int

    @property
    def closed(self) -> float:
        """(random - schedule) / (random - oracle); NaN when the gap is under one request."""
        return gap_closed(self.random_mean, self.violations, self.oracle)


def gap_closed(random_mean: float, violations: float, oracle: float) -> float:
    gap = random_mean - oracle
    return (random_mean - violations) / gap if gap >= MIN_GAP_REQUESTS else float("nan")


@dataclass
class SeedBench:
    """Everything one seed's scoring needs, built once (see the module docstring)."""

    regime: str
    seed: int
    timeline: pd.DataFrame
    requests: pd.DataFrame
    calibration: Calibration
    time_scale: float
    space: ActionSpace
    slo: SloSpec
    draws: int
    oracle_evals: int
    _random: dict[int, tuple[float, list[tuple[Schedule, int]]]] = field(default_factory=dict)
    _best: dict[int, int] = field(default_factory=dict)

    @classmethod
    def build(cls, params: Params, regime: str, seed: int, load: tuple[pd.DataFrame, pd.DataFrame],
              root: Path = Path("."), draws: int | None = None, time_scale: float | None = None) -> SeedBench:
        """`load`: the seed's (timeline, requests) (`traces.stage.seed_loads`); `time_scale`: trace seconds per
        wall second of the load; None: the real arm's plan (else 1)."""
        timeline, requests = load
        calibration = simulator_calibration(params.replay.simulator.calibration, root)
        time_scale = simulator_time_scale(root, regime) if time_scale is None else time_scale
        space = ActionSpace.of_params(params, regime)
        cfg = params.regimes[regime]
        quiet = no_sync(regime, seed, cfg.duration_s, params.merge.window_s, params.merge.min_gap_s)
        slo = resolve_slo(params, simulate_at_time_scale(requests, timeline, quiet, calibration, seed, time_scale))
        return cls(regime, seed, timeline, requests, calibration, time_scale, space, slo,
                   params.schedules.random_draws if draws is None else draws, params.replay.simulator.oracle_evals)

    def violations(self, schedule: Schedule) -> int:
        results = simulate_at_time_scale(self.requests, self.timeline, schedule, self.calibration, self.seed,
                                         self.time_scale)
        return int(violation_mask(results, self.slo).sum())

    def controller(self, params: Params, policy: str) -> Schedule:
        """`policy`'s schedule on this seed's load under `params` (the harness's learners)."""
        schedule, _ = run_harness(params, self.regime, policy, self.seed, self.timeline)
        return schedule

    def score(self, schedule: Schedule) -> Scored:
        n = schedule.n_merges
        own = self.violations(schedule)
        random_mean, draws = self._references(schedule)
        if n not in self._best:
            found = slo_oracle(schedule, self.space, self.requests, self.timeline, self.calibration, self.seed,
                               self.slo, draws, max_evals=self.oracle_evals, time_scale=self.time_scale)
            self._best[n] = found.violations
        self._best[n] = min(self._best[n], own)
        return Scored(self.seed, n, own, random_mean, self._best[n])

    def _references(self, schedule: Schedule) -> tuple[float, list[tuple[Schedule, int]]]:
        n = schedule.n_merges
        if n not in self._random:
            # the draws depend on the seed, regime, policy name and count only: one set per count
            scored = [(d, self.violations(d)) for d in (matched_random(schedule, k, self.space) for k in range(self.draws))]
            self._random[n] = (float(np.mean([v for _, v in scored])) if scored else float("nan"), scored)
        return self._random[n]

    def rescored(self, scored: Scored) -> Scored:
        """`scored` against the best schedule of its count found since (the oracle only improves)."""
        return Scored(scored.seed, scored.n_merges, scored.violations, scored.random_mean,
                      self._best[scored.n_merges])
