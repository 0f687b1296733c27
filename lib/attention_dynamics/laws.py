"""The closed-form backward pass of an attention head (results R1-R3 of the digest).

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

from .checks import check_same_dtype_device, check_tensor
from .head import Attention, HeadParams, attend, merge_heads, project
from .readout import Readout, cross_entropy_readout, split_heads

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
    "HeadState",
    "head_forward",
    "head_backward",
    "loss_and_gradients",
]


def compatibility(u: Tensor, v: Tensor) -> Tensor:
    """b_ij = u_i . v_j: how much the loss would rise per unit of attention from i to j."""
    return u @ v.transpose(-1, -2)


def expected_compatibility(weights: Tensor, b: Tensor) -> Tensor:
    """E_{alpha_i}[b] = sum_k alpha_ik b_ik, shape (..., T, 1)."""
    # Hidden keys carry alpha = 0 but b may be anything there; multiply through zeros safely.
    return torch.where(weights > 0, weights * b, torch.zeros((), dtype=b.dtype)).sum(-1, keepdim=True)


def advantage(weights: Tensor, b: Tensor) -> Tensor:
    """b_ij - E_{alpha_i}[b]: negative where key j is better than the query's average."""
    return b - expected_compatibility(weights, b)


def routing_gradient(weights: Tensor, b: Tensor) -> Tensor:
    """R1: dL/ds_ij = alpha_ij (b_ij - E_{alpha_i}[b]); rows sum to zero."""
    return torch.where(weights > 0, weights * advantage(weights, b), torch.zeros((), dtype=b.dtype))


def value_gradient(weights: Tensor, u: Tensor) -> Tensor:
    """R2: dL/dv_j = sum_i alpha_ij u_i, the responsibility-weighted error signal."""
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
    """The whole backward pass of ``attend`` from an upstream gradient u = dL/dg."""
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


@dataclass(frozen=True)
class HeadState:
    """The forward pass of H heads: queries from x (B, T, d_x), keys and values from
    ``memory`` (B, S, d_m), which is x itself for self-attention."""

    x: Tensor
    memory: Tensor
    q: Tensor  # (B, H, T, d_k)
    k: Tensor  # (B, H, S, d_k)
    v: Tensor  # (B, H, S, d_v)
    attention: Attention
    merged: Tensor  # (B, T, H * d_v)


def head_forward(params: HeadParams, x: Tensor, *, memory: Tensor | None = None, causal: bool = False,
                 key_mask: Tensor | None = None) -> HeadState:
    """Project to queries, keys and values for every head and attend.

    ``memory``: optional (B, S, d_m) inputs of the keys and values (default: x).
    ``key_mask``: optional bool (B, S), True at real (non-padding) keys.
    """
    check_tensor("x", x, ndim=3, nonempty=True)
    check_same_dtype_device(x=x, W_Q=params.W_Q)
    if x.shape[-1] != params.W_Q.shape[1]:
        raise ValueError(f"x has width {x.shape[-1]} but the head expects d_x = {params.W_Q.shape[1]}")
    if memory is None:
        memory = x
    else:
        check_tensor("memory", memory, ndim=3, nonempty=True)
        check_same_dtype_device(x=x, memory=memory)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"memory must have the batch size {x.shape[0]} of x, got shape {tuple(memory.shape)}")
    if memory.shape[-1] != params.W_K.shape[1]:
        raise ValueError(f"the keys read width {memory.shape[-1]} but the head expects d_m = {params.W_K.shape[1]}")
    if key_mask is not None:
        check_tensor("key_mask", key_mask, ndim=2, kind="bool")
        if key_mask.shape != memory.shape[:2]:
            raise ValueError(f"key_mask must have shape (B, S) = {tuple(memory.shape[:2])}, got {tuple(key_mask.shape)}")
        key_mask = key_mask[:, None, :]  # broadcast over heads
    q, k, v = project(x, params.W_Q), project(memory, params.W_K), project(memory, params.W_V)
    att = attend(q, k, v, causal=causal, key_mask=key_mask)
    return HeadState(x=x, memory=memory, q=q, k=k, v=v, attention=att, merged=merge_heads(att.output))


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
