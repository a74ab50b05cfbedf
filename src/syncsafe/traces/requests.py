"""Open-loop request lists whose arrival rate follows a load timeline.

Arrivals are a doubly stochastic process: per timeline step the count is
Poisson (arrival_cv = 1) or gamma-mixed Poisson (arrival_cv > 1, clumpier)
with mean `arrival_rate * step_s`, and arrival times are uniform inside the
step. Token lengths are clipped log-normals. Arrivals never depend on
completions: replay sends each request at its `arrival_s`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from syncsafe.artifacts.traces import REQUEST_COLUMNS
from syncsafe.config import RequestShape

__all__ = ["REQUEST_COLUMNS", "generate_requests"]


def generate_requests(
    timeline: pd.DataFrame, shape: RequestShape, step_s: float, rng: np.random.Generator
) -> pd.DataFrame:
    """Draw the request list for one timeline."""
    mean_counts = timeline["arrival_rate"].to_numpy() * step_s
    if shape.arrival_cv > 1.0:
        # Gamma-mixed Poisson: variance/mean of the mixing gamma gives the requested CV.
        k = 1.0 / (shape.arrival_cv**2 - 1.0)
        mean_counts = rng.gamma(k, mean_counts / k)
    counts = rng.poisson(mean_counts)
    starts = np.repeat(timeline["t_s"].to_numpy(), counts)
    arrivals = np.sort(starts + rng.uniform(0.0, step_s, starts.size))
    n = arrivals.size
    prompt = _clipped_lognormal(rng, shape.prompt_tokens_median, shape.prompt_tokens_sigma, shape.prompt_tokens_max, n)
    output = _clipped_lognormal(rng, shape.output_tokens_median, shape.output_tokens_sigma, shape.output_tokens_max, n)
    return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": prompt, "output_tokens": output})


def _clipped_lognormal(rng: np.random.Generator, median: float, sigma: float, upper: int, n: int) -> np.ndarray:
    values = np.rint(rng.lognormal(np.log(median), sigma, n))
    return np.clip(values, 1, upper).astype(np.int64)
