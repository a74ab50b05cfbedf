"""Multiplicity control of the verdict table: a declared primary test, then Holm.

The table makes one claim per (policy, regime). Tested each at alpha, some
would pass by chance alone. The protocol therefore declares one primary
(policy, regime) before the data (params ``analysis.primary``): it is tested
first, alone, at alpha. Only if it is rejected are the other tests judged, as
one Holm family at alpha (fixed-sequence gatekeeping: the family-wise error
of the whole table stays at alpha). A table without the primary is one Holm
family.

Adjusted p-values express the whole procedure: a test is rejected exactly
when its adjusted p is below alpha. The primary keeps its own p; every other
test gets ``max(p_primary, holm_adjusted_p)``, so nothing passes while the
primary does not.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np


def holm_adjusted(p_values: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Holm step-down adjusted p-values: ``max_{j <= i} min(1, (m - j + 1) * p_(j))``."""
    keys = sorted(p_values, key=lambda k: (p_values[k], str(k)))
    m = len(keys)
    adjusted, running = {}, 0.0
    for i, key in enumerate(keys):
        running = max(running, min(1.0, (m - i) * float(p_values[key])))
        adjusted[key] = running
    return adjusted


def gatekept_adjusted(p_values: Mapping[Hashable, float], primary: Hashable | None) -> dict[Hashable, float]:
    """Adjusted p-values of the primary-then-Holm procedure (see the module docstring)."""
    p_values = {k: (1.0 if not np.isfinite(v) else float(v)) for k, v in p_values.items()}
    if primary is None or primary not in p_values:
        return holm_adjusted(p_values)
    gate = p_values[primary]
    others = holm_adjusted({k: v for k, v in p_values.items() if k != primary})
    return {primary: gate, **{k: max(gate, v) for k, v in others.items()}}
