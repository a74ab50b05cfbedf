"""The artifact contract: where every stage output lives and how it is read and written.

The bottom of the package above `errors`, `io` and `procs`: it imports no
other syncsafe module. :mod:`.layout` spells every path under data/, runs/,
reports/ (and logs/, models/); one module per artifact family reads and
writes its files with their columns and keys checked:

* :mod:`.traces`: load timelines and request lists (data/traces/).
* :mod:`.schedules`: the merge-schedule contract (one JSON per schedule).
* :mod:`.schedule_sets`: per-regime schedule sets and the schedule index.
* :mod:`.train_runs`: training runs (metrics, schedule, decision log, curves, timing).
* :mod:`.replay_sets`: replays (requests, summary), their set indexes and the replay index.
* :mod:`.calibration`: calibration, fit, mechanism and fidelity JSON.
* :mod:`.reports`: the analysis's policy table and metrics.

Readers raise :class:`.base.ArtifactError` (a `BadInput`) naming the file.
"""

from syncsafe.artifacts.base import ArtifactError, ArtifactMalformed, ArtifactMissing

__all__ = ["ArtifactError", "ArtifactMalformed", "ArtifactMissing"]
