"""Studies: named sets of params points (ablations, sensitivity sweeps) run as DVC experiments and judged as one family."""
