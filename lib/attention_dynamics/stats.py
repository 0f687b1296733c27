"""Small statistics used across chapters: log-log slopes, mean and spread over seeds."""
from __future__ import annotations

import numpy as np

__all__ = ["loglog_slope", "mean_std"]


def loglog_slope(x, y) -> tuple[float, float, float]:
    """Least-squares fit of log|y| = slope * log x + c. Returns (slope, c, standard error
    of the slope). Zero or negative x, and zero y, are refused: they have no logarithm."""
    x = np.asarray(x, dtype=float)
    y = np.abs(np.asarray(y, dtype=float))
    if x.shape != y.shape or x.ndim != 1 or x.size < 3:
        raise ValueError(f"x and y must be 1-D of the same length >= 3, got {x.shape} and {y.shape}")
    if np.any(x <= 0) or np.any(y == 0) or not np.all(np.isfinite(y)):
        raise ValueError("x must be positive and y non-zero and finite for a log-log fit")
    lx, ly = np.log(x), np.log(y)
    A = np.stack([lx, np.ones_like(lx)], 1)
    coef, res, *_ = np.linalg.lstsq(A, ly, rcond=None)
    resid = ly - A @ coef
    dof = max(x.size - 2, 1)
    se = float(np.sqrt(resid @ resid / dof / np.sum((lx - lx.mean()) ** 2)))
    return float(coef[0]), float(coef[1]), se


def mean_std(values, axis=0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    a = np.asarray(values, dtype=float)
    if a.ndim == 0 or a.shape[axis] == 0:
        raise ValueError(f"mean_std needs at least one value along axis {axis}, got shape {a.shape}")
    n = a.shape[axis]
    return a.mean(axis), (a.std(axis, ddof=1) if n > 1 else np.zeros_like(a.mean(axis)))
