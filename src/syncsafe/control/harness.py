"""The stress harness's learner-progress model: DiLoCo learning without training.

Stands in for real islands so every policy × seed × regime runs in seconds.
The global model's loss follows a saturating curve in the tokens merged into
it, L(T) = floor + span / (1 + T / half_loss_tokens). Between merges each
island learns alone from its shard, with diminishing returns as it drifts
from the global model: after k local steps its useful tokens are
tokens_per_step * tau * (1 - exp(-k / tau)), tau = staleness_decay_steps. A
merge adds every island's useful tokens to the global model, so merging
rarely wastes local work and merging often spends fleet time. Observation
noise on the reported losses comes from the seed.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from syncsafe.config import HarnessConfig
from syncsafe.control.types import LearnerReport


class ProgressModelLearners:
    def __init__(self, cfg: HarnessConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng([seed, zlib.crc32(b"harness")])
        self.global_tokens = 0.0
        self.local_steps = 0
        self.tokens_processed = 0
        self.merges = 0
        self._last_loss = [self.loss(0.0)] * cfg.islands

    def loss(self, tokens: float) -> float:
        c = self.cfg
        return c.loss_floor + c.loss_span / (1.0 + tokens / c.half_loss_tokens)

    def _useful_local_tokens(self) -> float:
        tau = self.cfg.staleness_decay_steps
        return self.cfg.tokens_per_step * tau * (1.0 - math.exp(-self.local_steps / tau))

    def train_cycle(self, steps: int) -> list[LearnerReport]:
        self.local_steps += steps
        self.tokens_processed += steps * self.cfg.tokens_per_step * self.cfg.islands
        clean = self.loss(self.global_tokens + self._useful_local_tokens())
        noise = self.rng.normal(0.0, self.cfg.loss_noise, self.cfg.islands)
        reports = []
        for island in range(self.cfg.islands):
            end = clean * (1.0 + noise[island])
            reports.append(
                LearnerReport(
                    island=island,
                    loss_start=self._last_loss[island],
                    loss_end=end,
                    tokens_since_merge=self.local_steps * self.cfg.tokens_per_step,
                    staleness_steps=self.local_steps,
                )
            )
            self._last_loss[island] = end
        return reports

    def merge(self) -> None:
        self.global_tokens += self.cfg.islands * self._useful_local_tokens()
        self.local_steps = 0
        self.merges += 1
        self._last_loss = [self.global_loss] * self.cfg.islands

    @property
    def global_loss(self) -> float:
        """Loss of the merged global model (what eval would measure)."""
        return self.loss(self.global_tokens)
