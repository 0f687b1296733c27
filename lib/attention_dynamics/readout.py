"""The linear cross-entropy read-out of the paper's setting: z_i = W_O^T g_i, mean cross-entropy.

Its backward is what feeds the laws: u_i = dL/dg_i = (1/n) W_O (p_i - e_{y_i}).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .validation import NonFiniteError, check_same_dtype_device, check_tensor

__all__ = ["Readout", "cross_entropy_readout"]


@dataclass(frozen=True)
class Readout:
    loss: Tensor  # scalar, mean over counted positions, in nats
    logits: Tensor  # (..., T, C)
    log_probs: Tensor
    grad_logits: Tensor  # dL/dz
    u: Tensor  # dL/dg, shape of g
    grad_W_O: Tensor


def cross_entropy_readout(g: Tensor, W_O: Tensor, y: Tensor, *, mask: Tensor | None = None) -> Readout:
    """g: (..., T, d) read-out inputs; W_O: (d, C); y: (..., T) integer targets in [0, C);
    mask: optional bool (..., T), True at positions that count in the mean."""
    check_tensor("g", g, min_ndim=2)
    check_tensor("W_O", W_O, ndim=2, nonempty=True)
    check_same_dtype_device(g=g, W_O=W_O)
    check_tensor("y", y, kind="int")
    if g.shape[-1] != W_O.shape[0]:
        raise ValueError(f"W_O must have {g.shape[-1]} rows to read g, got shape {tuple(W_O.shape)}")
    if y.shape != g.shape[:-1]:
        raise ValueError(f"y must have shape {tuple(g.shape[:-1])}, got {tuple(y.shape)}")
    if y.numel() == 0:
        raise ValueError(f"y has no positions (shape {tuple(y.shape)}); the mean cross-entropy needs at least one")
    C = W_O.shape[1]
    if int(y.min()) < 0 or int(y.max()) >= C:
        raise ValueError(f"y must hold class indices in [0, {C - 1}], got values in [{int(y.min())}, {int(y.max())}]")
    if mask is None:
        weight = torch.full(y.shape, 1.0 / y.numel(), dtype=g.dtype, device=g.device)
    else:
        check_tensor("mask", mask, kind="bool")
        if mask.shape != y.shape:
            raise ValueError(f"mask must have shape {tuple(y.shape)}, got {tuple(mask.shape)}")
        n = int(mask.sum())
        if n == 0:
            raise ValueError("mask hides every position; at least one must count in the loss")
        weight = mask.to(g.dtype) / n
    logits = g @ W_O
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteError(f"the logits overflow {logits.dtype} (largest |g| {float(g.abs().max()):.3g}, "
                             f"largest |W_O| {float(W_O.abs().max()):.3g})")
    log_probs = torch.log_softmax(logits, dim=-1)
    nll = -log_probs.gather(-1, y.long().unsqueeze(-1)).squeeze(-1)
    loss = (weight * nll).sum()
    onehot = torch.nn.functional.one_hot(y.long(), C).to(g.dtype)
    grad_logits = (log_probs.exp() - onehot) * weight.unsqueeze(-1)
    u = grad_logits @ W_O.T
    grad_W_O = g.reshape(-1, g.shape[-1]).T @ grad_logits.reshape(-1, C)
    return Readout(loss, logits, log_probs, grad_logits, u, grad_W_O)
