"""The forward pass of an attention head (the paper's setting, its section 1).

Shapes follow one convention: any number of leading batch dimensions ``...`` (a batch,
several heads, several independent runs), then positions, then features.

    q: (..., T, d_k)   k: (..., S, d_k)   v: (..., S, d_v)
    scores s: (..., T, S)   weights alpha: (..., T, S)   output g: (..., T, d_v)

Several heads are independent heads: they are a leading dimension, nothing more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .validation import NonFiniteError, check_bool, check_dtype, check_float, check_int, check_same_dtype_device, check_tensor

__all__ = ["Attention", "allowed_keys", "attend", "HeadParams", "init_head", "init_memory_head", "project", "merge_heads",
           "split_heads", "HeadState", "head_forward"]


@dataclass(frozen=True)
class Attention:
    """Everything the forward pass computed; the closed-form backward reads it."""

    scores: Tensor  # s_ij = q_i . k_j * scale; -inf where key j is hidden from query i
    weights: Tensor  # alpha_ij; exactly 0 where hidden
    output: Tensor  # g_i = sum_j alpha_ij v_j
    scale: float
    allowed: Tensor | None  # bool (..., T, S) broadcastable, or None when nothing is hidden


def allowed_keys(T: int, S: int, *, causal: bool, key_mask: Tensor | None, batch_shape, device) -> Tensor | None:
    """Boolean (..., T, S) mask of the keys each query may attend to (None: all).

    ``key_mask`` is True for real keys and False for padding; its shape is the batch shape
    (or one broadcastable to it) followed by S. ``causal`` lets query i see keys j <= i.
    """
    allowed = None
    if causal:
        if T != S:
            raise ValueError(f"causal attention needs as many queries as keys, got T={T} and S={S}")
        allowed = torch.ones(T, S, dtype=torch.bool, device=device).tril()
    if key_mask is not None:
        check_tensor("key_mask", key_mask, min_ndim=1, kind="bool")
        if key_mask.shape[-1] != S:
            raise ValueError(f"key_mask must end in the number of keys S={S}, got shape {tuple(key_mask.shape)}")
        try:
            torch.broadcast_shapes(key_mask.shape[:-1], tuple(batch_shape))
        except RuntimeError:
            raise ValueError(
                f"key_mask has batch shape {tuple(key_mask.shape[:-1])}, which does not broadcast "
                f"to the batch shape {tuple(batch_shape)} of q, k and v"
            ) from None
        km = key_mask[..., None, :]
        allowed = km if allowed is None else (allowed & km)
    if allowed is not None:
        full = allowed.expand(*torch.broadcast_shapes(allowed.shape, (*batch_shape, T, S)))
        if not bool(full.any(-1).all()):
            where = "causal and key_mask" if causal and key_mask is not None else "key_mask"
            raise ValueError(f"{where} hide every key from at least one query; each query needs one visible key")
    return allowed


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None,
           scale: float | None = None) -> Attention:
    """Scaled dot-product attention, returning scores, weights and outputs.

    ``scale`` defaults to 1/sqrt(d_k) as in the paper. Every query needs at least one
    visible key, so no dimension may be empty (no queries, no keys, d_k = 0 or an empty
    batch are refused by name). Finite inputs whose scores overflow the dtype raise
    :class:`~attention_dynamics.validation.NonFiniteError` instead of returning NaN weights.
    """
    check_tensor("q", q, min_ndim=2)
    check_tensor("k", k, min_ndim=2)
    check_tensor("v", v, min_ndim=2)
    if k.shape[-2] == 0:
        raise ValueError(f"k has no keys (shape {tuple(k.shape)}); each query needs at least one visible key")
    if q.shape[-2] == 0:
        raise ValueError(f"q has no queries (shape {tuple(q.shape)}); attention needs at least one")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, nonempty=True, finite=False)
    check_same_dtype_device(q=q, k=k, v=v)
    check_bool("causal", causal)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys, got {k.shape[-2]} and {v.shape[-2]}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k and v must share their batch shape, got {tuple(q.shape[:-2])}, "
            f"{tuple(k.shape[:-2])} and {tuple(v.shape[:-2])}"
        )
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else check_float("scale", scale, 0.0, None, low_open=True)
    T, S = q.shape[-2], k.shape[-2]
    allowed = allowed_keys(T, S, causal=causal, key_mask=key_mask, batch_shape=q.shape[:-2], device=q.device)
    scores = (q @ k.transpose(-1, -2)) * scale
    # q and k are finite, so a non-finite score is an overflow of the dtype (float32 past
    # ~3e38); the softmax would turn it into NaN weights
    if not bool(torch.isfinite(scores).all()):
        raise NonFiniteError(
            f"attention scores overflow {scores.dtype} (largest finite |q|, |k| entries "
            f"{float(q.abs().max()):.3g}, {float(k.abs().max()):.3g}); rescale q and k or compute in float64")
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return Attention(scores=scores, weights=weights, output=weights @ v, scale=scale, allowed=allowed)


@dataclass
class HeadParams:
    """Parameters of H independent heads with a linear read-out.

    W_Q: (H, d_x, d_k) reads the query inputs; W_K: (H, d_m, d_k) and W_V: (H, d_m, d_v)
    read the key/value inputs (the same sequence for self-attention, so d_m = d_x, or a
    separate memory); W_O: (H * d_v, C) maps the concatenated head outputs to C logits.
    No biases, as in the authors' script.
    """

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor

    def __post_init__(self):
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            check_tensor(name, getattr(self, name), ndim=2 if name == "W_O" else 3, nonempty=True)
        check_same_dtype_device(W_Q=self.W_Q, W_K=self.W_K, W_V=self.W_V, W_O=self.W_O)
        H, d_x, d_k = self.W_Q.shape
        if self.W_K.shape[0] != H or self.W_K.shape[2] != d_k:
            raise ValueError(f"W_K must have shape ({H}, d_m, {d_k}) to match W_Q {tuple(self.W_Q.shape)}, got {tuple(self.W_K.shape)}")
        if self.W_V.shape[:2] != self.W_K.shape[:2]:
            raise ValueError(f"W_V must have shape {tuple(self.W_K.shape[:2])} + (d_v,) to match W_K, got {tuple(self.W_V.shape)}")
        if self.W_O.shape[0] != H * self.W_V.shape[2]:
            raise ValueError(f"W_O must have H * d_v = {H * self.W_V.shape[2]} rows, got {tuple(self.W_O.shape)}")

    def as_dict(self) -> dict[str, Tensor]:
        return {"W_Q": self.W_Q, "W_K": self.W_K, "W_V": self.W_V, "W_O": self.W_O}

    def clone(self) -> "HeadParams":
        return HeadParams(**{n: t.detach().clone() for n, t in self.as_dict().items()})


def init_head(d_x: int, d_k: int, d_v: int, n_classes: int, *, heads: int = 1, std: float = 0.1,
              d_m: int | None = None, generator: torch.Generator | None = None, dtype=torch.float64) -> HeadParams:
    """All four matrices drawn N(0, std^2), in the order W_Q, W_K, W_V, W_O. ``d_m``: width
    of a separate key/value memory (default: self-attention, d_m = d_x)."""
    d_m = d_x if d_m is None else d_m
    check_dtype("dtype", dtype)
    for name, val in (("d_x", d_x), ("d_k", d_k), ("d_v", d_v), ("n_classes", n_classes), ("heads", heads), ("d_m", d_m)):
        check_int(name, val, 1, None)
    check_float("std", std, 0.0, None, low_open=True)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype) * std

    return HeadParams(draw(heads, d_x, d_k), draw(heads, d_m, d_k), draw(heads, d_m, d_v), draw(heads * d_v, n_classes))


def init_memory_head(d_x: int, n_slots: int, n_classes: int, d_k: int = 4, d_v: int = 4, *, std: float = 0.1,
                     seed: int = 0, symmetric: float | None = None, dtype=torch.float64) -> dict[str, Tensor]:
    """One head reading a memory of ``n_slots`` one-hot slots, so that slot j's key and value
    are free vectors (row j of W_K and of W_V); parameters as a dict for the training loop,
    drawn N(0, std^2) in the order W_Q, W_K, W_V, W_O. ``symmetric=eps``: every slot starts
    from the same key and value plus a perturbation of relative size eps, the nearly
    symmetric start of the symmetry-breaking experiment (chapter *Routing and content
    specialize together*)."""
    d_x = check_int("d_x", d_x, 1, 4096)
    M = check_int("n_slots", n_slots, 1, 4096)
    K = check_int("n_classes", n_classes, 1, 4096)
    d_k = check_int("d_k", d_k, 1, 4096)
    d_v = check_int("d_v", d_v, 1, 4096)
    std = check_float("std", std, 0.0, None, low_open=True)
    dt = check_dtype("dtype", dtype)
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=dt) * std

    W_Q, W_K, W_V, W_O = draw(1, d_x, d_k), draw(1, M, d_k), draw(1, M, d_v), draw(d_v, K)
    if symmetric is not None:
        eps = check_float("symmetric", symmetric, 0.0, None)
        W_K = W_K[:, :1].expand(1, M, d_k) + eps * draw(1, M, d_k)
        W_V = W_V[:, :1].expand(1, M, d_v) + eps * draw(1, M, d_v)
    HeadParams(W_Q, W_K, W_V, W_O)  # validates the shapes
    return {"W_Q": W_Q.clone(), "W_K": W_K.clone(), "W_V": W_V.clone(), "W_O": W_O.clone()}


def project(x: Tensor, W: Tensor) -> Tensor:
    """(B, T, d_x) @ (H, d_x, d) -> (B, H, T, d): one projection per head."""
    check_tensor("x", x, ndim=3)
    check_tensor("W", W, ndim=3)
    check_same_dtype_device(x=x, W=W)
    if x.shape[-1] != W.shape[1]:
        raise ValueError(f"x has width {x.shape[-1]} but W reads width {W.shape[1]} (W is (H, d_x, d) = {tuple(W.shape)})")
    return torch.einsum("btx,hxd->bhtd", x, W)


def merge_heads(g: Tensor) -> Tensor:
    """(B, H, T, d_v) -> (B, T, H * d_v): the concatenation the read-out sees."""
    check_tensor("g", g, ndim=4, finite=False)
    B, H, T, d_v = g.shape
    return g.transpose(1, 2).reshape(B, T, H * d_v)


def split_heads(u_merged: Tensor, heads: int) -> Tensor:
    """(B, T, H * d_v) -> (B, H, T, d_v), the inverse of :func:`merge_heads`."""
    check_tensor("u_merged", u_merged, ndim=3, finite=False)
    check_int("heads", heads, 1, None)
    B, T, Hd = u_merged.shape
    if Hd % heads:
        raise ValueError(f"u_merged's width {Hd} is not a multiple of heads = {heads}")
    return u_merged.reshape(B, T, heads, Hd // heads).transpose(1, 2)


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
