"""Medians with bootstrap confidence intervals, for run times and for ratios of run times.

NumPy only: used inside the DaCe environment (runner, MPI scaling) and by the harness.
"""
from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000


def median_ci(samples, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Median of ``samples`` and a percentile-bootstrap confidence interval of the median."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("median_ci: samples: empty")
    med = float(np.median(x))
    if x.size == 1:
        return {"median": med, "ci_low": med, "ci_high": med, "n": 1}
    r = np.random.default_rng(seed)
    boot = np.median(x[r.integers(0, x.size, size=(resamples, x.size))], axis=1)
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return {"median": med, "ci_low": float(lo), "ci_high": float(hi), "n": int(x.size)}


def ratio_ci(baseline, samples, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """median(baseline) / median(samples) — a speedup when both are times — with a bootstrap CI.

    Both samples are resampled independently (they come from separate runs).
    """
    b = np.asarray(baseline, dtype=np.float64)
    s = np.asarray(samples, dtype=np.float64)
    if b.size == 0 or s.size == 0:
        raise ValueError("ratio_ci: baseline/samples: empty")
    ratio = float(np.median(b) / np.median(s))
    r = np.random.default_rng(seed)
    bb = np.median(b[r.integers(0, b.size, size=(resamples, b.size))], axis=1)
    ss = np.median(s[r.integers(0, s.size, size=(resamples, s.size))], axis=1)
    lo, hi = np.quantile(bb / ss, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return {"ratio": ratio, "ci_low": float(lo), "ci_high": float(hi)}


def geomean(values) -> float:
    v = [float(x) for x in values if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
