"""Which load a controller's knobs may be tuned on, and which the judging sees: never the same trace time.

A synthetic regime's seeds are independent draws, so tuning seeds are simply
other seeds than the judged ones (`params.seeds`). A trace regime's seed s
is the segment [offset_s + s * stride_s, + duration_s) of one recorded
trace, and neighbouring seeds overlap when stride_s < duration_s: a tuning
segment must share no trace second with any judged segment. `TuningSplit`
checks that and names every overlap; `default_tuning_seeds` proposes seeds
that pass (for a trace regime: the seeds on the regime's own stride grid
that fit in the trace and clear every judged segment; none when the judged
segments cover the trace, and then the error says how to make room).
"""

from __future__ import annotations

from dataclasses import dataclass

from syncsafe.config import Params, TraceRegime
from syncsafe.errors import BadInput
from syncsafe.traces.trace_regime import load_trace, segment_bounds

#: Tuning seeds proposed for a synthetic regime, counted from the first seed after the judged ones.
DEFAULT_SYNTHETIC_TUNING_SEEDS = 5


@dataclass(frozen=True)
class TuningSplit:
    """The judged seeds and the tuning seeds of one regime, with the trace time each covers (None: synthetic)."""

    regime: str
    judged: tuple[int, ...]
    tuning: tuple[int, ...]
    #: seed -> [start, end) trace seconds, for trace regimes
    segments: dict[int, tuple[float, float]] | None

    @classmethod
    def of(cls, params: Params, regime: str, tuning: list[int] | None = None,
           judged: list[int] | None = None) -> TuningSplit:
        """The split of `regime`, refused (BadInput naming each clash) when tuning and judging share load."""
        if regime not in params.regimes:
            raise BadInput(f"regime {regime!r} is not in params.yaml regimes ({', '.join(params.regimes)})")
        judged = sorted(set(params.seeds if judged is None else judged))
        tuning = sorted(set(default_tuning_seeds(params, regime, judged) if tuning is None else tuning))
        if not tuning:
            raise BadInput(_no_room(params, regime, judged))
        if min(tuning) < 0:
            raise BadInput(f"tuning seeds must be >= 0 (got {min(tuning)})")
        cfg = params.regimes[regime]
        if not isinstance(cfg, TraceRegime):
            shared = sorted(set(tuning) & set(judged))
            if shared:
                raise BadInput(f"regime {regime}: tuning seeds {shared} are judged seeds too; tune on other seeds")
            return cls(regime, tuple(judged), tuple(tuning), None)
        segments = {s: segment_bounds(cfg, s) for s in sorted(set(judged) | set(tuning))}
        clashes = [f"tuning seed {t} [{segments[t][0]:g}, {segments[t][1]:g}) s overlaps judged seed {j} "
                   f"[{segments[j][0]:g}, {segments[j][1]:g}) s"
                   for t in tuning for j in judged if _overlap(segments[t], segments[j])]
        if clashes:
            raise BadInput(f"regime {regime}: tuning and judged segments share trace time: " + "; ".join(clashes[:4])
                           + (f" (+{len(clashes) - 4} more)" if len(clashes) > 4 else ""))
        return cls(regime, tuple(judged), tuple(tuning), segments)

    def describe(self, seeds: tuple[int, ...]) -> str:
        """`seeds` as the report names them: seeds, or segments of trace time."""
        if self.segments is None:
            return "seeds " + ", ".join(map(str, seeds))
        return "segments " + ", ".join(f"{s} [{self.segments[s][0]:g}, {self.segments[s][1]:g}) s" for s in seeds)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] - 1e-9 and b[0] < a[1] - 1e-9


def default_tuning_seeds(params: Params, regime: str, judged: list[int]) -> list[int]:
    """Seeds to tune on that share nothing with `judged` (see the module docstring); may be empty."""
    cfg = params.regimes[regime]
    if not isinstance(cfg, TraceRegime):
        first = max(judged, default=-1) + 1
        return list(range(first, first + DEFAULT_SYNTHETIC_TUNING_SEEDS))
    _, _, length = load_trace(params, regime)
    taken = [segment_bounds(cfg, s) for s in judged]
    out, seed = [], 0
    while segment_bounds(cfg, seed)[1] <= length + 1e-9:
        if not any(_overlap(segment_bounds(cfg, seed), t) for t in taken):
            out.append(seed)
        seed += 1
    return out


def _no_room(params: Params, regime: str, judged: list[int]) -> str:
    cfg = params.regimes[regime]
    _, _, length = load_trace(params, regime)
    start, end = segment_bounds(cfg, min(judged))[0], segment_bounds(cfg, max(judged))[1]
    return (f"regime {regime}: the judged segments (seeds {min(judged)}..{max(judged)}) cover [{start:g}, {end:g}) s "
            f"of the {length:.0f} s trace and leave no {cfg.duration_s:g} s segment on its {cfg.segment_stride_s:g} s "
            f"grid to tune on: judge fewer seeds (--judged, or params seeds) or move offset_s")
