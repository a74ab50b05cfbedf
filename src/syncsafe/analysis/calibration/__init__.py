"""Calibration of the simulator to the real server, the mechanism gate and held-out fidelity.

* :mod:`.records`: real replays as records, simulated at their own span and time scale.
* :mod:`.mechanism`: merge-active requests by arrival, paired sync ratio against
  the nearest no-sync controls, block-bootstrap gate (`runs/calibration/mechanism.json`).
* :mod:`.fit`: the iteration-level model fitted to the server profile and the
  fit seeds' replays (`runs/calibration/calibration.json`).
* :mod:`.fidelity`: the simulator on held-out seeds' real replays
  (`runs/fidelity/fidelity.json`, table, CDF figure).
* :mod:`.report`, :mod:`.stage`: the stages' reports and entry functions.
"""

from syncsafe.analysis.calibration.fit import CalibrationFit, fit_calibration
from syncsafe.analysis.calibration.mechanism import mechanism_evidence, regime_mechanism
from syncsafe.analysis.calibration.records import ReplayRecord, read_vllm_records, simulate_record
from syncsafe.analysis.calibration.stage import calibrate_fit_stage, fidelity_stage

__all__ = [
    "CalibrationFit",
    "ReplayRecord",
    "calibrate_fit_stage",
    "fidelity_stage",
    "fit_calibration",
    "mechanism_evidence",
    "read_vllm_records",
    "regime_mechanism",
    "simulate_record",
]
