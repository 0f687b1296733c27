"""A selective state-space layer of the Mamba (S6) kind, written as content-based value
routing (R9; chapter *One routing law for attention and selective SSMs*).

Per channel c and state n, with the selection Delta_t, B_t, C_t computed from the input:

    h_t[c, n] = exp(Delta_t[c] A[c, n]) h_{t-1}[c, n] + Delta_t[c] B_t[n] x_t[c]
    y_t[c]    = sum_n C_t[n] h_t[c, n] + D[c] x_t[c]

Unrolled, every channel routes its values v_j = x_j[c] as attention does, g_t = sum_j w_tj v_j:

    w_tj[c] = sum_n C_t[n] exp(A[c, n] (S_t[c] - S_j[c])) Delta_j[c] B_j[n],  j <= t,

with S the running sum of Delta. The weights are not normalized over j. With the upstream
gradient u_t = dL/dg_t, the compatibility b_tj = u_t v_j is dL/dw_tj exactly as in attention
(:func:`attention_dynamics.laws.compatibility`, one channel = one head with values of width
1), and every routing gradient is a sum of b against the derivative of w
(:func:`ssm_backward`); no expectation of b is subtracted anywhere, because nothing
normalizes w. In attention, dL/ds_ij = alpha_ij (b_ij - E_alpha[b]) (R1): the advantage
comes from the softmax.

- :func:`ssm_scan`: the recurrence (in PyTorch operations, the reference; a compiled kernel
  for float32 training);
- :func:`ssm_weights`: the materialized weights w (B, C, T, T);
- :func:`ssm_backward`: the closed-form gradients of the scan's inputs from u;
- :class:`SelectiveSSM`: the Mamba block (input and gate projections, a short causal
  convolution, the selective scan, the gated output), parameter for parameter the block of
  the reference implementation ``mambapy`` (tested against it);
- :class:`SSMModel`: a small residual stack of such blocks with the same interface as
  :class:`attention_dynamics.transformer.CausalTransformer`, so that one ``fit`` trains both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .native import dispatch, selective_scan_kernel
from .validation import check_bool, check_choice, check_int, check_model_input, check_tensor

__all__ = ["ssm_scan", "ssm_weights", "ssm_backward", "SSMGrads", "SSMConfig", "SelectiveSSM", "SSMTrace",
           "SSMModel"]


def _check_inputs(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    check_tensor("x", x, ndim=3, nonempty=True)
    Bt, T, Dc = x.shape
    check_tensor("delta", delta, ndim=3)
    if delta.shape != x.shape:
        raise ValueError(f"delta must have the shape of x {tuple(x.shape)}, got {tuple(delta.shape)}")
    check_tensor("A", A, ndim=2)
    if A.shape[0] != Dc:
        raise ValueError(f"A must have shape ({Dc}, N), got {tuple(A.shape)}")
    for name, t in (("B", B), ("C", C)):
        check_tensor(name, t, ndim=3)
        if t.shape != (Bt, T, A.shape[1]):
            raise ValueError(f"{name} must have shape {(Bt, T, A.shape[1])}, got {tuple(t.shape)}")
    if len({t.dtype for t in (x, delta, A, B, C)}) != 1:
        raise TypeError("x, delta, A, B and C must share one dtype")


class _CompiledScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, delta, A, B, C):
        nb, T, nc = x.shape
        lib = selective_scan_kernel(A.shape[1])
        x, delta, A, B, C = (t.contiguous() for t in (x, delta, A, B, C))
        y, h = torch.empty_like(x), torch.empty(nc, A.shape[1])  # named: they must outlive the call
        lib.scan_forward(nb, T, nc, x.data_ptr(), delta.data_ptr(), A.data_ptr(), B.data_ptr(),
                         C.data_ptr(), y.data_ptr(), h.data_ptr())
        ctx.save_for_backward(x, delta, A, B, C)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, delta, A, B, C = ctx.saved_tensors
        nb, T, nc = x.shape
        N = A.shape[1]
        lib = selective_scan_kernel(N)
        gy = gy.contiguous()
        dx, ddelta, dB, dC = (torch.empty_like(t) for t in (x, delta, B, C))
        dA, work, carry = torch.zeros_like(A), torch.empty(T + 1, nc, N), torch.empty(nc, N)
        lib.scan_backward(nb, T, nc, x.data_ptr(), delta.data_ptr(), A.data_ptr(), B.data_ptr(),
                          C.data_ptr(), gy.data_ptr(), dx.data_ptr(), ddelta.data_ptr(), dA.data_ptr(),
                          dB.data_ptr(), dC.data_ptr(), work.data_ptr(), carry.data_ptr())
        return dx, ddelta, dA, dB, dC


def ssm_scan(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None, *,
             compiled: bool | None = None) -> Tensor:
    """The selective scan, step by step: x, delta (batch, T, channels), A (channels, N),
    B, C (batch, T, N), D (channels,) or None. Returns y (batch, T, channels).
    ``compiled=None``: float32 CPU inputs go through the compiled kernel
    (:mod:`attention_dynamics.native`; tested against this recurrence) where it is the
    faster path measured on this processor and it builds; True: the kernel; False: always
    the recurrence in PyTorch operations."""
    _check_inputs(x, delta, A, B, C)
    if D is not None:
        check_tensor("D", D, ndim=1)
        if D.shape != x.shape[2:] or D.dtype != x.dtype:
            raise ValueError(f"D must have shape ({x.shape[2]},) and dtype {x.dtype}, "
                             f"got {tuple(D.shape)} and {D.dtype}")
    fits = x.dtype == torch.float32 and x.device.type == "cpu" and 1 <= A.shape[1] <= 256  # what the kernel takes
    y = dispatch("selective_scan", compiled, fits,
                 lambda: _CompiledScan.apply(x, delta, A, B, C), lambda: _recurrence(x, delta, A, B, C))
    return y if D is None else y + D * x


def _recurrence(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    # time leading and contiguous: each step's slices are dense blocks (strided slices make
    # every small product of the loop several times slower, forward and backward)
    decay = torch.exp(delta[..., None] * A).movedim(1, 0).contiguous()  # (T, batch, channels, N)
    drive = ((delta * x)[..., None] * B[:, :, None, :]).movedim(1, 0).contiguous()
    h = torch.zeros_like(decay[0])
    hs = []
    # unbind once: indexing [t] in the loop would make autograd write a full-size zero
    # tensor per step on the way back
    for a_t, d_t in zip(decay.unbind(0), drive.unbind(0)):
        h = a_t * h + d_t
        hs.append(h)
    return (torch.stack(hs, 1) * C[:, :, None, :]).sum(-1)


def _decay(delta: Tensor, A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """E[b, c, n, t, j] = exp(A[c, n] (S_t[c] - S_j[c])) for j <= t (else 0), the running
    sums S, and the lower-triangular mask (T, T)."""
    T = delta.shape[1]
    S = delta.cumsum(1)  # (batch, T, channels)
    mask = torch.ones(T, T, dtype=torch.bool, device=delta.device).tril()
    gap = (S[:, :, None, :] - S[:, None, :, :]).masked_fill(~mask[None, :, :, None], 0.0)  # (b, t, j, c)
    E = torch.exp(torch.einsum("btjc,cn->bcntj", gap, A)) * mask
    return E, S, mask


def ssm_weights(delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The routing weights w[b, c, t, j] of every channel (zero for j > t), one state at a
    time so that memory stays at one (batch, channels, T, T) tensor."""
    _check_inputs(torch.zeros_like(delta), delta, A, B, C)
    T = delta.shape[1]
    S = delta.cumsum(1).transpose(1, 2)  # (batch, channels, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=delta.device).tril()
    gap = (S[..., :, None] - S[..., None, :]).masked_fill(~mask, 0.0)  # S_t - S_j
    drive = delta.transpose(1, 2)[..., None, :]  # Delta_j, (batch, channels, 1, T)
    w = torch.zeros_like(gap)
    in_place = not (torch.is_grad_enabled() and any(t.requires_grad for t in (delta, A, B, C)))
    for n in range(A.shape[1]):
        cb = (C[:, :, n, None] * B[:, None, :, n])[:, None]  # C_t[n] B_j[n], (batch, 1, T, T)
        if in_place:  # no graph to keep: reuse the buffers (these tensors are large)
            w.addcmul_(cb, torch.exp(A[:, n, None, None] * gap).mul_(drive))
        else:
            w = w + cb * torch.exp(A[:, n, None, None] * gap) * drive
    return w * mask


@dataclass(frozen=True)
class SSMGrads:
    """The closed-form gradients of the scan's inputs, from u = dL/dy."""

    b: Tensor  # (batch, channels, T, T): b_tj = u_t v_j = dL/dw_tj (zero for j > t)
    x: Tensor  # dL/dx through the values and the skip D: sum_t w_tj u_t + D u_j
    delta: Tensor  # dL/dDelta (through the decays and the drive Delta_j)
    A: Tensor  # dL/dA
    B: Tensor  # dL/dB
    C: Tensor  # dL/dC
    D: Tensor | None  # dL/dD = sum_t u_t x_t


def ssm_backward(u: Tensor, x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                 D: Tensor | None = None) -> SSMGrads:
    """Closed-form gradients of the selective scan (with Delta, B, C held as inputs), no
    autograd: with F_tj[c, n] = b_tj[c] C_t[n] E_tj[c, n] Delta_j[c] B_j[n] the (c, n) share
    of b_tj w_tj,

        dL/dC_t[n]  = sum_{c, j} b_tj E_tj Delta_j B_j[n]
        dL/dB_j[n]  = sum_{c, t} b_tj C_t[n] E_tj Delta_j
        dL/dA[c, n] = sum_{t, j} F_tj (S_t - S_j)
        dL/dDelta_k = sum_{m >= k} dL/dS_m + sum_t b_tk sum_n C_t[n] E_tk B_k[n], where
        dL/dS_m = sum_n A[c, n] (sum_j F_mj - sum_t F_tm)  (S_m enters as S_t and as S_j).
    """
    _check_inputs(x, delta, A, B, C)
    check_tensor("u", u, ndim=3)
    if u.shape != x.shape:
        raise ValueError(f"u must have the shape of x {tuple(x.shape)}, got {tuple(u.shape)}")
    E, S, mask = _decay(delta, A)
    b = torch.einsum("btc,bjc->bctj", u, x) * mask
    G = b[:, :, None] * E  # (b, c, n, t, j)
    dC = torch.einsum("bcntj,bjc,bjn->btn", G, delta, B)
    dB = torch.einsum("bcntj,btn,bjc->bjn", G, C, delta)
    Fs = G * C.permute(0, 2, 1)[:, None, :, :, None] * (delta.permute(0, 2, 1)[:, :, None, None, :]
                                                         * B.permute(0, 2, 1)[:, None, :, None, :])
    gap = S.permute(0, 2, 1)[:, :, None, :, None] - S.permute(0, 2, 1)[:, :, None, None, :]
    dA = (Fs * gap).sum((0, 3, 4))
    H = torch.einsum("bcntj,cn->bctj", Fs, A)
    dS = H.sum(-1) - H.sum(-2)  # (b, c, T): as S_t, minus as S_j
    d_delta = dS.flip(-1).cumsum(-1).flip(-1).permute(0, 2, 1)  # S_m = sum_{k <= m} Delta_k
    d_delta = d_delta + torch.einsum("bcntk,btn,bkn->bkc", G, C, B)  # the drive Delta_j itself
    w = torch.einsum("btn,bcntj,bjc,bjn->bctj", C, E, delta, B)
    dx = torch.einsum("bctj,btc->bjc", w, u)
    dD = None
    if D is not None:
        dx = dx + D * u
        dD = (u * x).sum((0, 1))
    return SSMGrads(b=b, x=dx, delta=d_delta, A=dA, B=dB, C=dC, D=dD)


@dataclass(frozen=True)
class SSMConfig:
    """A small stack of selective-SSM blocks: inputs as in
    :class:`attention_dynamics.transformer.TransformerConfig` (``linear`` vectors of width
    ``d_in`` or ``tokens`` below ``vocab``), ``n_layers`` residual blocks of width ``d_model``
    (pre-RMSNorm), each expanding to ``expand * d_model`` channels with ``d_state`` states per
    channel, a causal convolution of width ``d_conv`` and a rank-``dt_rank`` Delta."""

    n_out: int
    d_model: int = 32
    n_layers: int = 2
    d_state: int = 8
    expand: int = 2
    d_conv: int = 4
    dt_rank: int | None = None  # default ceil(d_model / 16), as Mamba's
    input: str = "linear"
    d_in: int | None = None
    vocab: int | None = None

    def __post_init__(self):
        check_int("n_out", self.n_out, 1, None)
        check_int("d_model", self.d_model, 1, 4096)
        check_int("n_layers", self.n_layers, 1, 64)
        check_int("d_state", self.d_state, 1, 256)
        check_int("expand", self.expand, 1, 16)
        check_int("d_conv", self.d_conv, 1, 64)
        if self.dt_rank is not None:
            check_int("dt_rank", self.dt_rank, 1, self.d_model)
        check_choice("input", self.input, ("linear", "tokens"))
        if self.input == "linear":
            check_int("d_in", self.d_in, 1, None)
        else:
            check_int("vocab", self.vocab, 1, None)

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        return self.dt_rank or math.ceil(self.d_model / 16)


@dataclass(frozen=True)
class SSMTrace:
    """One block's routing, in the form :class:`attention_dynamics.transformer.HeadTrace`
    gives attention's: every channel is a head whose values have width 1. weights (B, C, T,
    T) = w, v (B, C, T, 1) = the channel's inputs x_j, output (B, C, T, 1) = sum_j w_tj v_j
    (before the skip D x_t and the gate); also Delta, B, C of the selection."""

    weights: Tensor
    v: Tensor
    output: Tensor
    delta: Tensor
    B: Tensor
    C: Tensor


class SelectiveSSM(nn.Module):
    """The Mamba block: [x, z] = in_proj(h); x = silu(causal depthwise conv(x)); Delta =
    softplus(dt_proj(x_proj_Delta(x)) + bias), B, C = x_proj(x); y = scan(x, Delta, A, B,
    C) + D x; out_proj(y * silu(z)). Parameter names and initialization follow the reference
    implementation (mambapy.mamba.MambaBlock), so that its state dict loads into this block.
    With ``inspect`` the scan runs through the materialized weights and the block returns
    an :class:`SSMTrace`."""

    def __init__(self, cfg: SSMConfig):
        super().__init__()
        self.cfg = cfg
        d, di, N, R = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.rank
        self.in_proj = nn.Linear(d, 2 * di, bias=False)
        self.conv1d = nn.Conv1d(di, di, kernel_size=cfg.d_conv, groups=di, padding=cfg.d_conv - 1)
        self.x_proj = nn.Linear(di, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, di, bias=True)
        std = R ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        # Delta starts log-uniform in [0.001, 0.1]: the bias is its inverse softplus
        dt = torch.exp(torch.rand(di) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32).repeat(di, 1)))
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, d, bias=False)

    def selection(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Delta (B, T, channels), B and C (B, T, N) from the block's inner input x."""
        N, R = self.cfg.d_state, self.cfg.rank
        dt, B, C = torch.split(self.x_proj(x), [R, N, N], dim=-1)
        return F.softplus(dt @ self.dt_proj.weight.T + self.dt_proj.bias), B, C

    def forward(self, h: Tensor, inspect: bool = False) -> tuple[Tensor, SSMTrace | None]:
        T = h.shape[1]
        x, z = self.in_proj(h).chunk(2, dim=-1)
        x = F.silu(self.conv1d(x.transpose(1, 2))[:, :, :T].transpose(1, 2))
        delta, B, C = self.selection(x)
        A = -torch.exp(self.A_log)
        trace = None
        if inspect:
            w = ssm_weights(delta, A, B, C)
            v = x.transpose(1, 2)[..., None]
            g = w @ v
            trace = SSMTrace(w, v, g, delta, B, C)
            y = g[..., 0].transpose(1, 2) + self.D * x
        else:
            y = ssm_scan(x, delta, A, B, C, self.D)
        return self.out_proj(y * F.silu(z)), trace


class SSMModel(nn.Module):
    """Input layer, ``n_layers`` residual blocks h + SelectiveSSM(RMSNorm(h)), a final RMSNorm
    and a linear read-out: the SSM counterpart of
    :class:`attention_dynamics.transformer.CausalTransformer`, with the same forward
    signature (logits and, with ``inspect``, one :class:`SSMTrace` per block)."""

    def __init__(self, cfg: SSMConfig):
        super().__init__()
        self.cfg = cfg
        self.inp = nn.Linear(cfg.d_in, cfg.d_model) if cfg.input == "linear" else nn.Embedding(cfg.vocab, cfg.d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(cfg.d_model, eps=1e-5) for _ in range(cfg.n_layers))
        self.blocks = nn.ModuleList(SelectiveSSM(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.out = nn.Linear(cfg.d_model, cfg.n_out)

    def forward(self, x: Tensor, *, inspect: bool = False) -> tuple[Tensor, list[SSMTrace]]:
        check_bool("inspect", inspect)
        check_model_input(x, self.cfg.input, vocab=self.cfg.vocab, d_in=self.cfg.d_in, dtype=self.inp.weight.dtype)
        h = self.inp(x)
        traces = []
        for norm, block in zip(self.norms, self.blocks):
            out, tr = block(norm(h), inspect)
            h = h + out
            if inspect:
                traces.append(tr)
        return self.out(self.ln_f(h)), traces

    def parameter_roles(self) -> dict[str, list[str]]:
        """Parameter names by role: 'routing' (what makes Delta, B, C and A: x_proj, dt_proj,
        A_log), 'values' (the maps that make the values x_j: in_proj, conv1d), 'other'."""
        roles = {"routing": [], "values": [], "other": []}
        for name, _ in self.named_parameters():
            part = name.split(".")[2] if name.startswith("blocks.") else ""
            role = "routing" if part in ("x_proj", "dt_proj", "A_log") else \
                "values" if part in ("in_proj", "conv1d") else "other"
            roles[role].append(name)
        return roles
