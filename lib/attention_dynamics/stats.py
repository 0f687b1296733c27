"""Small statistics used across chapters: log-log slopes, mean and spread over seeds, and
the first step at which a condition holds."""
from __future__ import annotations

import numpy as np

__all__ = ["loglog_slope", "mean_std", "mean_se", "first_true", "first_step_below", "exponential_growth_rate",
           "line_fit", "settle_step"]


def loglog_slope(x, y) -> tuple[float, float, float]:
    """Least-squares fit of log|y| = slope * log x + c. Returns (slope, c, standard error
    of the slope). Zero or negative x, and zero y, are refused: they have no logarithm."""
    x = np.asarray(x, dtype=float)
    y = np.abs(np.asarray(y, dtype=float))
    if x.shape != y.shape or x.ndim != 1 or x.size < 3:
        raise ValueError(f"x and y must be 1-D of the same length >= 3, got {x.shape} and {y.shape}")
    if np.any(x <= 0) or np.any(y == 0) or not np.all(np.isfinite(y)):
        raise ValueError("x must be positive and y non-zero and finite for a log-log fit")
    return line_fit(np.log(x), np.log(y))


def mean_std(values, axis=0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    a = np.asarray(values, dtype=float)
    if a.ndim == 0 or a.shape[axis] == 0:
        raise ValueError(f"mean_std needs at least one value along axis {axis}, got shape {a.shape}")
    n = a.shape[axis]
    return a.mean(axis), (a.std(axis, ddof=1) if n > 1 else np.zeros_like(a.mean(axis)))


def mean_se(values) -> tuple[float, float, int]:
    """Mean, standard error (sample sd / sqrt n; 0 for one value) and n of a flat list."""
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError("mean_se needs at least one value")
    n = a.size
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0, n


def first_true(condition, *, steps=None, never=None):
    """The first step at which ``condition`` holds. ``condition``: booleans along the steps
    (axis 0), shape (n,) or (n, R) for R runs; ``steps`` (n,): the step number of each entry
    (default: its index). Returns an int for one run, a float array of R entries for
    several; ``never`` where the condition never holds (default: None for one run, NaN for
    several)."""
    c = np.asarray(condition, dtype=bool)
    if c.ndim not in (1, 2) or c.shape[0] == 0:
        raise ValueError(f"condition must have shape (n,) or (n, R) with n >= 1, got {c.shape}")
    s = np.arange(c.shape[0]) if steps is None else np.asarray(steps)
    if s.shape != (c.shape[0],):
        raise ValueError(f"steps must have shape ({c.shape[0]},), got {s.shape}")
    if c.ndim == 1:
        return int(s[np.argmax(c)]) if c.any() else never
    fill = np.nan if never is None else never
    return np.array([float(s[np.argmax(col)]) if col.any() else fill for col in c.T])


def first_step_below(curve, threshold: float, **kw):
    """The first step at which ``curve`` falls below ``threshold`` (see :func:`first_true`)."""
    return first_true(np.asarray(curve) < threshold, **kw)


def exponential_growth_rate(steps, values) -> float:
    """Rate r of values ~ exp(r * step) in the exponential phase of a curve that starts
    small and saturates: the points between 10x the first value and a tenth of the largest,
    before the curve first exceeds that tenth. NaN when fewer than three points qualify."""
    steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    lo, hi = values[0] * 10, values.max() / 10
    phase = (values > lo) & (values < hi)
    if (values > hi).any():
        phase &= np.arange(len(values)) < np.argmax(values > hi)
    if phase.sum() < 3:
        return float("nan")
    return float(np.polyfit(steps[phase], np.log(values[phase]), 1)[0])


def line_fit(x, y) -> tuple[float, float, float]:
    """Least-squares line y = slope * x + intercept; returns (slope, intercept, standard
    error of the slope; NaN with fewer than three points)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"x and y must be 1-D of the same length >= 2, got {x.shape} and {y.shape}")
    coef = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)[0]
    resid = y - (coef[0] * x + coef[1])
    spread = np.sum((x - x.mean()) ** 2)
    se = float(np.sqrt(resid @ resid / (x.size - 2) / spread)) if x.size > 2 and spread > 0 else float("nan")
    return float(coef[0]), float(coef[1]), se


def settle_step(distance, fraction: float, steps) -> int:
    """The first step from which ``distance`` (to a final state, one value per checkpoint)
    stays at or below ``fraction`` of its initial value; the last step if it never does."""
    d, steps = np.asarray(distance, dtype=float), np.asarray(steps)
    ok = d <= fraction * d[0]
    for i in range(len(d)):
        if ok[i:].all():
            return int(steps[i])
    return int(steps[-1])

