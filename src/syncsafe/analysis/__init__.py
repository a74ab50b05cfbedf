"""The evidence protocol: statistics, verdicts, figures and the report.

A report line never claims more than its evidence licenses. Entry point:
:func:`analyze_runs` (runs table in; policy table, envelope, metrics, report
and figure out). The pieces, each in its own module:

* :mod:`.runs_table`: load and validate the per-run results table.
* :mod:`.sync_excess`: SLO minus the same seed's no-sync replay.
* :mod:`.envelope`: the per-seed matched-random envelope.
* :mod:`.stats`: one-sided permutation tests and bootstrap intervals (scipy).
* :mod:`.protocol`: per-seed scores and the per regime x policy summary.
* :mod:`.verdicts`: claim tiers and :class:`MechanismEvidence`.
* :mod:`.report`, :mod:`.figures`, :mod:`.metrics`: the outputs.
* :mod:`.synthetic`: constructed runs tables with known effects.
"""

from syncsafe.analysis.analyze import AnalysisResult, analyze_runs
from syncsafe.analysis.runs_table import RunsTable, RunsTableError, load_runs_table
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence, RegimeMechanism
from syncsafe.analysis.verdicts import Tier, Verdict

__all__ = [
    "AnalysisResult",
    "FidelityEvidence",
    "MechanismEvidence",
    "RegimeMechanism",
    "RunsTable",
    "RunsTableError",
    "Tier",
    "Verdict",
    "analyze_runs",
    "load_runs_table",
]
