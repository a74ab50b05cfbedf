"""The serving cost model: the iteration-level cost of the server and what a merge takes from it.

The calibrate-fit stage fits these parameters to a profile of the real server
and to real replays of the fit seeds, and writes them as JSON
(`runs/calibration/calibration.json`); the simulator (`syncsafe.serving.simulator`)
and the `wa_calibrated` policy read them. Until a fit exists the shipped
defaults below stand in (flagged by `fitted: false`). It lives in `control`,
below the serving code, because the calibrated policies price a merge with it
(`expected_merge_cost`) and every layer above reads the same model.

The server advances in engine iterations (continuous batching). One iteration
over a batch holding `n` decoding sequences and `P` prompt tokens being
prefilled costs, on an idle machine,

    iteration_ms = iter_base_ms + prefill_ms_per_token * P + decode_ms_per_seq * n

Everything else slows the *machine*, not the request: the server runs at speed

    speed(t) = (1 - merge_share(t)) / ((1 + pressure_slowdown * inference_pressure(t)) * jitter(t))

plus, outside the engine and taking no iteration, `request_overhead_ms` on TTFT
and E2E and `token_overhead_ms` per output token on E2E (the API server's HTTP
and streaming work). `merge_share(t)` is the share of the server's compute a merge takes
while its window is open (`merge_compute_share`, tilted across the window by
`merge_share_skew`: `share * (1 + skew)` in the first half, `share * (1 - skew)`
in the second, each at most 1; a share of 1 is a full stall: the server makes
no progress until the window closes), and `jitter` a log-normal (sigma `residual_sigma`) drawn once per
`jitter_step_s` of time from the seed. Queueing and its aftermath then emerge
from the batch, not from a multiplier. The defaults stand for a tiny Llama on
the vLLM CPU build: a median request (48 prompt, 24 output tokens) takes
~0.24 s alone; a full batch of 8 such requests saturates at ~17 requests/s without
pressure and ~10 at full pressure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactMalformed, ArtifactMissing
from syncsafe.artifacts.base import read_model
from syncsafe.artifacts.calibration import read_calibration
from syncsafe.control.merge_link import MergeLink
from syncsafe.control.types import FleetSignals

#: A number or an array of numbers (the multipliers work elementwise).
Numeric = TypeVar("Numeric", float, np.ndarray)

#: Largest compute share a merge may take: 1 is a full stall (the real CPU server all but stops during a merge).
MAX_MERGE_SHARE = 1.0
#: Largest work stretch `expected_merge_cost` prices a merge at (that of a 0.95 share): a full stall's stretch
#: is unbounded, its cost to a request bounded by the window, which the calibration does not know.
MAX_PRICED_SLOWDOWN = 20.0
#: Tokens of the median request of the cpu profile, for `service_ms`-based summaries.
TYPICAL_PROMPT_TOKENS = 48
TYPICAL_OUTPUT_TOKENS = 24


class CalibrationError(ArtifactMalformed):
    """A calibration file is missing or malformed (bad input: the message names the file)."""


class CalibrationMissing(CalibrationError, ArtifactMissing):
    """A calibration file that is not there."""


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Fixed cost of one engine iteration (scheduling, sampling, the forward pass's floor), ms.
    iter_base_ms: Annotated[float, Field(ge=0)] = 8.0
    #: Cost per prompt token prefilled in an iteration, ms.
    prefill_ms_per_token: Annotated[float, Field(ge=0)] = 0.2
    #: Cost per sequence decoding one token in an iteration, ms.
    decode_ms_per_seq: Annotated[float, Field(ge=0)] = 1.5
    #: Concurrent sequences the server batches (`--max-num-seqs`); further arrivals wait in a FIFO queue.
    max_batch: Annotated[int, Field(ge=1)] = 8
    #: Prompt tokens one iteration admits (vLLM's token budget); at least one request joins per iteration.
    max_prefill_tokens: Annotated[int, Field(ge=1)] = 2048
    #: Latency outside the engine (HTTP, tokenization, the API server's scheduling), added to TTFT and E2E;
    #: it takes no engine iteration.
    request_overhead_ms: Annotated[float, Field(ge=0)] = 0.0
    #: Streaming cost per output token outside the engine (detokenizing, server-sent events), added to E2E.
    token_overhead_ms: Annotated[float, Field(ge=0)] = 0.0
    #: Share of the server's compute a merge takes while its window is open.
    merge_compute_share: Annotated[float, Field(ge=0, le=MAX_MERGE_SHARE)] = 1.0 - 1.0 / 1.8
    #: Tilt of the share across the window: share*(1+skew) in the first half, share*(1-skew) in the second.
    merge_share_skew: Annotated[float, Field(ge=-1, le=1)] = 0.0
    #: Extra slowdown per unit of fleet inference pressure: speed / (1 + pressure_slowdown * p).
    pressure_slowdown: Annotated[float, Field(ge=0)] = 0.6
    #: Requests/s the server sustains before queueing dominates (full batch, full pressure, typical request).
    capacity_rps: Annotated[float, Field(gt=0)] = 8.0
    #: Sigma of the log-normal speed jitter (median 1), drawn once per `jitter_step_s`.
    residual_sigma: Annotated[float, Field(ge=0)] = 0.2
    jitter_step_s: Annotated[float, Field(gt=0)] = 1.0
    #: True once the calibrate-fit stage has fitted the values to real data.
    fitted: bool = False
    #: How long a merge keeps the fleet busy on its link (fitted on test hosts, `control.calibrated.merge_link`);
    #: None: every merge is priced as equally long.
    merge_link: MergeLink | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_merge_slowdown(cls, data: Any) -> Any:
        """A `merge_slowdown` m (the per-phase model's multiplier) reads as the compute share 1 - 1/m."""
        if isinstance(data, dict) and "merge_slowdown" in data:
            data = dict(data)
            m = float(data.pop("merge_slowdown"))
            if not m >= 1:
                raise ValueError(f"merge_slowdown must be >= 1 (got {m})")
            data.setdefault("merge_compute_share", min(1.0 - 1.0 / m, MAX_MERGE_SHARE))
        return data

    # ----------------------------------------------------------------- merge

    @property
    def merge_slowdown(self) -> float:
        """Mean factor by which a merge stretches the server's work inside a window: mean of 1 / (1 - share)
        (infinite when a half of the window is a full stall)."""
        halves = self.merge_shares()
        return float(np.mean([1.0 / (1.0 - s) if s < 1.0 else math.inf for s in halves]))

    @property
    def full_stall(self) -> bool:
        """True when a merge stops the server outright for at least half of its window."""
        return max(self.merge_shares()) >= 1.0

    def merge_shares(self) -> tuple[float, float]:
        """The compute share a merge takes in the first and the second half of its window."""
        s, k = self.merge_compute_share, self.merge_share_skew
        return (min(s * (1.0 + k), MAX_MERGE_SHARE), min(s * (1.0 - k), MAX_MERGE_SHARE))

    def expected_merge_cost(self, signals: FleetSignals) -> float:
        """Expected serving cost of a merge started now, in [0, ~1].

        The share of serving capacity in use (requests a merge would slow)
        times the extra latency a merge adds at the current pressure, times
        how much longer than on a free link the merge takes at the current
        network pressure (with a fitted `merge_link`). The stretch is priced at
        most `MAX_PRICED_SLOWDOWN` (a full stall's is unbounded).
        """
        load = min(signals.arrival_rate / self.capacity_rps, 1.0)
        stretch = min(self.merge_slowdown, MAX_PRICED_SLOWDOWN)  # finite for a full stall
        slowdown = (stretch - 1.0) * self.pressure_multiplier(signals.inference_pressure)
        longer = 1.0 if self.merge_link is None else self.merge_link.duration_factor(signals.network_pressure)
        return load * slowdown * longer

    # ----------------------------------------------------------------- cost model

    def pressure_multiplier(self, inference_pressure: Numeric) -> Numeric:
        """Latency multiplier of fleet inference pressure: 1 + pressure_slowdown * p."""
        return 1.0 + self.pressure_slowdown * inference_pressure

    def iteration_ms(self, prefill_tokens: Numeric, decode_seqs: Numeric) -> Numeric:
        """Idle-machine time of one iteration prefilling `prefill_tokens` while `decode_seqs` sequences decode."""
        return self.iter_base_ms + self.prefill_ms_per_token * prefill_tokens + self.decode_ms_per_seq * decode_seqs

    def service_ms(self, prompt_tokens: Numeric, output_tokens: Numeric, batch: Numeric = 1.0) -> Numeric:
        """A request's latency in a steady batch of `batch` sequences (itself included), no queue, no merge.

        One prefill iteration (which yields the first token) and one decode
        iteration per further output token, every iteration holding `batch`.
        """
        others = batch - 1.0
        prefill = self.iteration_ms(prompt_tokens, others)
        decode = self.iteration_ms(0.0, batch) * np.maximum(output_tokens - 1.0, 0.0)
        return prefill + decode

    def at_time_scale(self, time_scale: float) -> Calibration:
        """This server seen on trace time that runs `time_scale` times faster than wall time.

        A replay compressed `time_scale`-fold meets the server in wall time; on
        trace time the same server is `time_scale` times slower: every cost in
        trace ms is multiplied, the jitter is drawn per `jitter_step_s *
        time_scale` trace seconds, and the capacity divided. Simulating
        trace-time inputs with it gives `time_scale` times the latencies of
        simulating the wall-time inputs with this calibration.
        """
        if time_scale == 1.0:
            return self
        k = float(time_scale)
        return self.model_copy(update={
            "iter_base_ms": self.iter_base_ms * k, "prefill_ms_per_token": self.prefill_ms_per_token * k,
            "decode_ms_per_seq": self.decode_ms_per_seq * k, "request_overhead_ms": self.request_overhead_ms * k,
            "token_overhead_ms": self.token_overhead_ms * k, "jitter_step_s": self.jitter_step_s * k,
            "capacity_rps": self.capacity_rps / k,
        })  # fmt: skip

    def full_batch_capacity_rps(self) -> float:
        """Requests/s a full batch of typical requests sustains at full pressure."""
        per_request_ms = self.service_ms(float(TYPICAL_PROMPT_TOKENS), float(TYPICAL_OUTPUT_TOKENS),
                                         float(self.max_batch)) * self.pressure_multiplier(1.0)
        return self.max_batch / (per_request_ms / 1000.0)


#: Where the calibrate-fit stage writes its calibration (relative to the project root).
FITTED_CALIBRATION = layout.FITTED_CALIBRATION


def simulator_calibration(path: str | Path | None, root: str | Path = ".") -> Calibration:
    """The calibration the simulator replays use (`replay.simulator.calibration`).

    A path (relative to `root`) is loaded as given. None: the calibrate-fit
    stage's `runs/calibration/calibration.json` when it exists (fitted, or the
    shipped defaults with `fitted: false` when no fit was possible), else the
    shipped defaults; either way `fitted` says which the replays ran on.
    """
    if path is not None:
        return load_calibration(layout.at(root, path))
    fitted = layout.at(root, FITTED_CALIBRATION)
    return load_calibration(fitted if fitted.is_file() else None)


def policy_calibration(calibration: str | Path | None, merge_link: str | Path | None) -> Calibration:
    """What the calibrated policies price merges with: `control.calibrated.calibration` (or the shipped
    defaults) with `control.calibrated.merge_link`'s fitted link model, when one is named."""
    base = load_calibration(calibration)
    if merge_link is None:
        return base
    link = read_model(Path(merge_link), MergeLink, "merge link model (control.calibrated.merge_link)",
                      hint="write it with benchmarks/bench_merge_link.py --out, or set it to null",
                      error=CalibrationError, missing=CalibrationMissing)
    return base.model_copy(update={"merge_link": link})


def load_calibration(path: str | Path | None) -> Calibration:
    """The calibration at `path`, or the shipped defaults when `path` is None."""
    if path is None:
        return Calibration()
    return read_calibration(path, Calibration, error=CalibrationError, missing=CalibrationMissing)
