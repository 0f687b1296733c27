"""The closed forms against torch autograd: the attention head's backward (R1-R3) on one
configuration (:func:`compare_with_autograd`; the routing-law chapter runs it on many random
configurations, the property-based tests on configurations drawn by hypothesis) and the
selective SSM's (:func:`compare_ssm_with_autograd`, R9), both in the one error measure
:func:`relative_error`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .validation import check_choice, check_int
from .head import HeadParams, attend, head_forward, init_head, merge_heads, split_heads
from .laws import attention_backward, head_backward
from .readout import cross_entropy_readout

__all__ = ["GradConfig", "random_config", "compare_with_autograd", "LOSSES", "relative_error",
           "random_ssm_inputs", "compare_ssm_with_autograd"]

LOSSES = ("cross_entropy", "smooth")


@dataclass(frozen=True, kw_only=True)  # eleven fields: positional calls would be unreadable
class GradConfig:
    batch: int
    heads: int
    T: int  # queries
    S: int  # keys (equal to T for causal or self-attention)
    d_x: int
    d_k: int
    d_v: int
    n_classes: int
    causal: bool
    padding: bool  # pad the tail of some sequences' keys
    loss: str  # "cross_entropy" (linear read-out) or "smooth" (a non-CE downstream loss)

    def __post_init__(self):
        for name in ("batch", "heads", "T", "S", "d_x", "d_k", "d_v"):
            check_int(name, getattr(self, name), 1, 64)
        check_int("n_classes", self.n_classes, 2, 64)
        check_choice("loss", self.loss, LOSSES)
        if self.causal and self.T != self.S:
            raise ValueError(f"a causal configuration needs T == S, got T={self.T}, S={self.S}")

    def as_dict(self) -> dict:
        return asdict(self)


def random_config(rng: np.random.Generator) -> GradConfig:
    causal = bool(rng.random() < 0.5)
    T = int(rng.integers(1, 13))
    S = T if causal else int(rng.integers(1, 13))
    return GradConfig(
        batch=int(rng.integers(1, 4)), heads=int(rng.integers(1, 4)), T=T, S=S,
        d_x=int(rng.integers(1, 9)), d_k=int(rng.integers(1, 9)), d_v=int(rng.integers(1, 9)),
        n_classes=int(rng.integers(2, 7)), causal=causal, padding=bool(rng.random() < 0.5),
        loss=str(rng.choice(LOSSES)),
    )


def _key_mask(cfg: GradConfig, g: torch.Generator) -> torch.Tensor | None:
    """Padding at the tail, at least one real key per sequence (so every query sees one)."""
    if not cfg.padding:
        return None
    lengths = torch.randint(1, cfg.S + 1, (cfg.batch,), generator=g)
    return torch.arange(cfg.S)[None, :] < lengths[:, None]


def _downstream(cfg, g_out, W_O, y, R, query_mask):
    """Loss of the head output g_out (B, H, T, d_v) and its closed-form gradient u."""
    if cfg.loss == "cross_entropy":
        ro = cross_entropy_readout(merge_heads(g_out), W_O, y, mask=query_mask)
        return ro.loss, split_heads(ro.u, cfg.heads), ro
    # L = sum R * tanh(g) + 1/2 sum g^2 over counted queries; u = R (1 - tanh^2 g) + g
    m = torch.ones(g_out.shape[:-1], dtype=g_out.dtype) if query_mask is None else query_mask[:, None, :].to(g_out.dtype)
    m = m.expand(g_out.shape[:-1]).unsqueeze(-1)
    t = torch.tanh(g_out)
    loss = (m * (R * t + 0.5 * g_out**2)).sum()
    return loss, m * (R * (1 - t**2) + g_out), None


def _max_abs(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def _relative(abs_err: float, scale: float) -> float:
    return abs_err / scale if scale > 0 else abs_err  # two zero tensors agree exactly


def relative_error(a: torch.Tensor, b: torch.Tensor, *, scale: float | None = None) -> float:
    """max |a - b| over ``scale``, by default the larger of max |a| and max |b| (the error
    itself where the scale is 0)."""
    return _relative(_max_abs(a - b), max(_max_abs(a), _max_abs(b)) if scale is None else scale)


def _err(closed: torch.Tensor, auto: torch.Tensor) -> tuple[float, float]:
    """(max |error|, normwise relative error), the difference reduced once."""
    abs_err = _max_abs(closed - auto)
    return abs_err, _relative(abs_err, max(_max_abs(closed), _max_abs(auto)))


def compare_with_autograd(cfg: GradConfig, seed: int) -> dict[str, tuple[float, float]]:
    """Max absolute and normwise relative error, per quantity, of the closed forms against
    autograd in float64. Quantities: scores, q, k, v (a standalone attention with S keys)
    and W_Q, W_K, W_V (+ W_O for cross-entropy) of a self-attention head on T positions,
    and the row sums of dL/ds (reported as absolute values relative to max |dL/ds|)."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    errors: dict[str, tuple[float, float]] = {}

    # Level 1: attention on given q, k, v (cross-attention when S != T).
    q = torch.randn(cfg.batch, cfg.heads, cfg.T, cfg.d_k, generator=g, dtype=dt, requires_grad=True)
    k = torch.randn(cfg.batch, cfg.heads, cfg.S, cfg.d_k, generator=g, dtype=dt, requires_grad=True)
    v = torch.randn(cfg.batch, cfg.heads, cfg.S, cfg.d_v, generator=g, dtype=dt, requires_grad=True)
    km = _key_mask(cfg, g)
    W_O = torch.randn(cfg.heads * cfg.d_v, cfg.n_classes, generator=g, dtype=dt)
    y = torch.randint(0, cfg.n_classes, (cfg.batch, cfg.T), generator=g)
    R = torch.randn(cfg.batch, cfg.heads, cfg.T, cfg.d_v, generator=g, dtype=dt)
    att = attend(q, k, v, causal=cfg.causal, key_mask=None if km is None else km[:, None, :])
    att.scores.retain_grad()
    loss, u, _ = _downstream(cfg, att.output, W_O, y, R, None)
    loss.backward()
    with torch.no_grad():
        cf = attention_backward(att, q.detach(), k.detach(), v.detach(), u.detach())
        auto_ds = torch.nan_to_num(att.scores.grad, nan=0.0)
        errors["scores"] = _err(cf.scores, auto_ds)
        errors["q"] = _err(cf.q, q.grad)
        errors["k"] = _err(cf.k, k.grad)
        errors["v"] = _err(cf.v, v.grad)
        scale = float(cf.scores.abs().max())
        row = float(cf.scores.sum(-1).abs().max())
        errors["row_sum"] = (row, row / scale if scale > 0 else 0.0)

    # Level 2: a self-attention head with parameters; padding also removes padded queries from the loss.
    params = init_head(cfg.d_x, cfg.d_k, cfg.d_v, cfg.n_classes, heads=cfg.heads, std=0.7, generator=g, dtype=dt)
    x = torch.randn(cfg.batch, cfg.T, cfg.d_x, generator=g, dtype=dt)
    km = None
    if cfg.padding:
        lengths = torch.randint(1, cfg.T + 1, (cfg.batch,), generator=g)
        km = torch.arange(cfg.T)[None, :] < lengths[:, None]
    leaves = {n: t.clone().requires_grad_(True) for n, t in params.as_dict().items()}
    hp = HeadParams(**leaves)
    state = head_forward(hp, x, causal=cfg.causal, key_mask=km)
    loss, u, ro = _downstream(cfg, state.attention.output, hp.W_O, y, R, km)
    loss.backward()
    with torch.no_grad():
        det = HeadParams(**{n: t.detach() for n, t in leaves.items()})
        st = head_forward(det, x, causal=cfg.causal, key_mask=km)
        _, u_cf, ro_cf = _downstream(cfg, st.attention.output, det.W_O, y, R, km)
        grads, _ = head_backward(det, st, u_cf)
        for n in ("W_Q", "W_K", "W_V"):
            errors[n] = _err(grads[n], leaves[n].grad)
        if ro_cf is not None:
            errors["W_O"] = _err(ro_cf.grad_W_O, leaves["W_O"].grad)
    return errors


# --- the selective SSM of R9 (chapter *One routing law for attention and selective SSMs*) ---

def random_ssm_inputs(Bt: int, T: int, Dc: int, N: int, seed: int):
    """Inputs of a selective scan in float64 (x, Delta in [0.02, 0.82], A in [-3.05,
    -0.05], B, C, D) and an upstream gradient u, from a generator seeded ``seed``."""
    for name, v, hi in (("Bt", Bt, 64), ("T", T, 512), ("Dc", Dc, 256), ("N", N, 64)):
        check_int(name, v, 1, hi)
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    f64 = dict(generator=g, dtype=torch.float64)
    x = torch.randn(Bt, T, Dc, **f64)
    delta = torch.rand(Bt, T, Dc, **f64) * 0.8 + 0.02
    A = -(torch.rand(Dc, N, **f64) * 3 + 0.05)
    B, C = torch.randn(Bt, T, N, **f64), torch.randn(Bt, T, N, **f64)
    D, u = torch.randn(Dc, **f64), torch.randn(Bt, T, Dc, **f64)
    return x, delta, A, B, C, D, u


def compare_ssm_with_autograd(Bt: int, T: int, Dc: int, N: int, seed: int) -> dict[str, float]:
    """Normwise relative error of every closed form of :func:`attention_dynamics.ssm.ssm_backward`
    against autograd through the recurrence, and of b against autograd through the
    materialized weights (dL/dw), on one random configuration (float64)."""
    from .ssm import ssm_backward, ssm_scan, ssm_weights

    x, delta, A, B, C, D, u = random_ssm_inputs(Bt, T, Dc, N, seed)
    leaves = [t.clone().requires_grad_() for t in (x, delta, A, B, C, D)]
    auto = torch.autograd.grad(ssm_scan(*leaves), leaves, u)
    closed = ssm_backward(u, x, delta, A, B, C, D)
    w = ssm_weights(delta, A, B, C).requires_grad_()
    (dw,) = torch.autograd.grad(torch.einsum("bctj,bjc->btc", w, x), w, u)
    pairs = dict(zip(("x", "Δ", "A", "B", "C", "D"), zip((closed.x, closed.delta, closed.A, closed.B,
                                                        closed.C, closed.D), auto)))
    pairs["b = ∂L/∂w"] = (closed.b, dw * torch.ones(T, T, dtype=torch.float64).tril())
    return {name: relative_error(mine, ref) for name, (mine, ref) in pairs.items()}
