"""Does a change go the way a law predicts? The one sign-agreement measure that the
specialization chapter, the laws inside a transformer and the routing probes of the trained
models all use, with the weighting of the entries as an argument.

Each caller says which weighting it uses and why:

- none (``weights=None``): every entry counts once. The plain share is what "the change has
  the predicted sign" means, entry by entry; its chance level is one half.
- by the prediction's strength (``alpha * |advantage|`` in the specialization chapter): an
  entry the law pushes hard counts more than one it barely touches.
- by the movement (``|change|``): an entry that moved a lot counts more than one that barely
  moved, so that, summed over a run, the agreeing share is the share of the movement that
  follows the law (a plateau counts as little as it moves).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .validation import check_tensor

__all__ = ["Agreement", "measurable", "sign_agreement"]


@dataclass(frozen=True)
class Agreement:
    """``rate``: the share of the compared entries whose change has the predicted sign (NaN
    when none is compared); ``weighted``: the same share with the entries weighted (equal to
    ``rate`` without weights); ``agreeing_weight`` / ``total_weight``: its numerator and
    denominator, to pool over steps; ``n``: the number of entries compared, and
    ``compared`` the mask of them (bool, the shape of the change), for a caller that
    measures something else on the same entries."""
    rate: float
    weighted: float
    agreeing_weight: float
    total_weight: float
    n: int
    compared: Tensor | None = field(default=None, repr=False, compare=False)


def measurable(t: Tensor, rel_tol: float) -> Tensor:
    """Where ``t`` is more than ``rel_tol`` times its largest magnitude: the entries that
    have a sign to speak of."""
    return t.abs() > rel_tol * t.abs().max()


def sign_agreement(change: Tensor, predicted: Tensor, *, where: Tensor | None = None,
                   weights: Tensor | None = None, rel_tol: float = 1e-9) -> Agreement:
    """How often ``change`` has the sign of ``predicted`` (the law's direction of change),
    over the entries in ``where`` (default: all) at which both are :func:`measurable`.
    ``weights``: each entry's weight in ``weighted`` (default: every entry 1)."""
    check_tensor("change", change, min_ndim=1, nonempty=True)
    for name, t in (("predicted", predicted), ("where", where), ("weights", weights)):
        if t is not None and t.shape != change.shape:
            raise ValueError(f"{name} must have the shape of change {tuple(change.shape)}, got {tuple(t.shape)}")
    keep = measurable(change, rel_tol) & measurable(predicted, rel_tol)
    if where is not None:
        keep = keep & where
    n = int(keep.sum())
    if n == 0:
        nan = float("nan")
        return Agreement(nan, nan, 0.0, 0.0, 0, keep)
    agree = (torch.sign(change) == torch.sign(predicted))[keep].double()
    w = torch.ones_like(agree) if weights is None else weights[keep].double()
    agreeing, total = float((agree * w).sum()), float(w.sum())
    rate = float(agree.mean())
    return Agreement(rate, agreeing / total if total > 0 else float("nan"), agreeing, total, n, keep)
