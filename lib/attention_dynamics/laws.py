"""The closed-form backward pass of an attention head (results R1-R3 of the paper).

Given the upstream gradient u_i = dL/dg_i, with no autograd:

    compatibility   b_ij = u_i . v_j                         (dL/dalpha_ij, alpha held free)
    R1 routing      dL/ds_ij = alpha_ij (b_ij - E_{alpha_i}[b])
    R2 values       dL/dv_j  = sum_i alpha_ij u_i
    R3 queries      dL/dq_i  = scale * sum_j dL/ds_ij k_j
       keys         dL/dk_j  = scale * sum_i dL/ds_ij q_i
    parameters      dL/dW_Q = X^T dL/dQ (likewise W_K, W_V), dL/dW_O = G^T dL/dZ
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .validation import check_same_dtype_device, check_tensor
from .head import Attention, HeadParams, HeadState, head_forward, split_heads
from .readout import Readout, cross_entropy_readout

__all__ = [
    "compatibility",
    "expected_compatibility",
    "advantage",
    "routing_gradient",
    "value_gradient",
    "query_gradient",
    "key_gradient",
    "attention_entropy",
    "AttentionGrads",
    "attention_backward",
    "head_backward",
    "loss_and_gradients",
    "head_loss_fn",
]


def compatibility(u: Tensor, v: Tensor) -> Tensor:
    """b_ij = u_i . v_j: how much the loss would rise per unit of attention from i to j
    (chapter *The advantage-based routing law*)."""
    return u @ v.transpose(-1, -2)


def expected_compatibility(weights: Tensor, b: Tensor) -> Tensor:
    """E_{alpha_i}[b] = sum_k alpha_ik b_ik, shape (..., T, 1)."""
    # Hidden keys carry alpha = 0 but b may be anything there; multiply through zeros safely.
    return torch.where(weights > 0, weights * b, torch.zeros((), dtype=b.dtype)).sum(-1, keepdim=True)


def advantage(weights: Tensor, b: Tensor) -> Tensor:
    """b_ij - E_{alpha_i}[b]: negative where key j is better than the query's average
    (chapter *The advantage-based routing law*)."""
    return b - expected_compatibility(weights, b)


def routing_gradient(weights: Tensor, b: Tensor) -> Tensor:
    """R1: dL/ds_ij = alpha_ij (b_ij - E_{alpha_i}[b]); rows sum to zero (chapter *The
    advantage-based routing law*)."""
    return torch.where(weights > 0, weights * advantage(weights, b), torch.zeros((), dtype=b.dtype))


def value_gradient(weights: Tensor, u: Tensor) -> Tensor:
    """R2: dL/dv_j = sum_i alpha_ij u_i, the responsibility-weighted error signal (chapter
    *Responsibility-weighted values and first-order descent*)."""
    return weights.transpose(-1, -2) @ u


def query_gradient(grad_scores: Tensor, k: Tensor, scale: float) -> Tensor:
    """R3: dL/dq_i = scale * sum_j dL/ds_ij k_j."""
    return (grad_scores @ k) * scale


def key_gradient(grad_scores: Tensor, q: Tensor, scale: float) -> Tensor:
    """R3: dL/dk_j = scale * sum_i dL/ds_ij q_i."""
    return (grad_scores.transpose(-1, -2) @ q) * scale


def attention_entropy(weights: Tensor) -> Tensor:
    """Entropy of each query's attention distribution in nats, shape (..., T)."""
    check_tensor("weights", weights, min_ndim=1)
    logw = torch.log(torch.where(weights > 0, weights, torch.ones((), dtype=weights.dtype)))
    return -(weights * logw).sum(-1)


@dataclass(frozen=True)
class AttentionGrads:
    compatibility: Tensor  # b
    scores: Tensor  # dL/ds
    q: Tensor
    k: Tensor
    v: Tensor


def attention_backward(att: Attention, q: Tensor, k: Tensor, v: Tensor, u: Tensor) -> AttentionGrads:
    """The whole backward pass of ``attend`` from an upstream gradient u = dL/dg: R1-R3
    (chapter *The advantage-based routing law*)."""
    check_tensor("u", u, min_ndim=2)
    check_same_dtype_device(q=q, u=u)
    if u.shape != att.output.shape:
        raise ValueError(f"u must have the shape of the attention output {tuple(att.output.shape)}, got {tuple(u.shape)}")
    b = compatibility(u, v)
    ds = routing_gradient(att.weights, b)
    return AttentionGrads(
        compatibility=b,
        scores=ds,
        q=query_gradient(ds, k, att.scale),
        k=key_gradient(ds, q, att.scale),
        v=value_gradient(att.weights, u),
    )


def head_backward(params: HeadParams, state: HeadState, u: Tensor) -> tuple[dict[str, Tensor], AttentionGrads]:
    """Gradients of W_Q, W_K, W_V from u = dL/dg of shape (B, H, T, d_v), plus the
    per-position gradients of R1-R3."""
    g = attention_backward(state.attention, state.q, state.k, state.v, u)
    grads = {
        "W_Q": torch.einsum("btx,bhtd->hxd", state.x, g.q),
        "W_K": torch.einsum("bsx,bhsd->hxd", state.memory, g.k),
        "W_V": torch.einsum("bsx,bhsd->hxd", state.memory, g.v),
    }
    return grads, g


def loss_and_gradients(params: HeadParams, x: Tensor, y: Tensor, *, memory: Tensor | None = None,
                       causal: bool = False, key_mask: Tensor | None = None
                       ) -> tuple[Tensor, dict[str, Tensor], HeadState, Readout, AttentionGrads]:
    """Mean cross-entropy of the linear read-out and all four parameter gradients, in
    closed form. In self-attention, padding positions (key_mask False) neither are
    attended to nor count in the loss."""
    state = head_forward(params, x, memory=memory, causal=causal, key_mask=key_mask)
    ro = cross_entropy_readout(state.merged, params.W_O, y, mask=key_mask if memory is None else None)
    grads, g = head_backward(params, state, split_heads(ro.u, params.W_Q.shape[0]))
    grads["W_O"] = ro.grad_W_O
    return ro.loss, grads, state, ro, g


def head_loss_fn(x: Tensor, y: Tensor, *, memory: Tensor | None = None, causal: bool = False,
                 key_mask: Tensor | None = None):
    """A loss function for :func:`attention_dynamics.training.train`: the head's mean
    cross-entropy on fixed inputs, with all four gradients in closed form (R1-R3).

    ``out.info`` carries what the measurements of the specialization and EM chapters read:
    ``alpha`` (B, H, T, S), ``b`` (the compatibilities), ``u`` (B, H, T, d_v), ``scores``,
    ``grad_scores``, ``values`` (B, H, S, d_v), ``log_probs`` (B, T, C), and
    ``responsibility``, N_j = sum_i alpha_ij summed over the batch, (H, S): the shape of
    W_V's rows when the memory is one one-hot slot per key, as the prototype M-step needs."""
    from .training import StepOutput

    def loss_fn(p: dict[str, Tensor]) -> StepOutput:
        loss, grads, state, ro, ag = loss_and_gradients(HeadParams(**p), x, y, memory=memory, causal=causal,
                                                        key_mask=key_mask)
        alpha = state.attention.weights
        info = {"alpha": alpha, "b": ag.compatibility, "u": split_heads(ro.u, alpha.shape[1]),
                "scores": state.attention.scores, "grad_scores": ag.scores, "values": state.v,
                "log_probs": ro.log_probs, "responsibility": alpha.sum((0, 2))}
        return StepOutput(loss, grads, info)

    return loss_fn

