"""One small causal transformer, for the deep sticky-chain variant and the wind tunnel.

Pre-LayerNorm blocks (multi-head causal self-attention, then a GELU feed-forward), a final
LayerNorm and a linear read-out. Inputs are either real vectors (a linear input layer, as in
the sticky chain) or tokens (an embedding, plus learned positions, as in the wind tunnel).

Training runs attention through ``torch.nn.functional.scaled_dot_product_attention``
(fused, causal). With ``inspect=True`` the same forward pass computes attention explicitly
with :func:`attention_dynamics.head.attend` and returns every head's scores, weights,
queries, keys and values; the two paths agree to rounding (tested).

:func:`fit` is the one way every transformer of the book trains (the deep sticky-chain
variant and the wind tunnel): AdamW with one parameter group per role, a cosine schedule to
zero, optional clipping, through :func:`attention_dynamics.training.train`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import contextlib
from typing import Callable

from .head import Attention, attend
from .training import ROLES, History, StepOutput, TorchOptimizer, train
from .validation import check_bool, check_choice, check_float, check_int, check_tensor

__all__ = ["TransformerConfig", "CausalTransformer", "HeadTrace", "parameter_groups", "make_optimizer", "fit",
           "evaluating", "log_probs_at", "sequence_metrics"]


@dataclass(frozen=True)
class TransformerConfig:
    n_out: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.0
    input: str = "linear"  # "linear" (real vectors of width d_in) or "tokens" (ids < vocab)
    d_in: int | None = None
    vocab: int | None = None
    max_len: int | None = None  # learned positional embeddings when set

    def __post_init__(self):
        check_int("n_out", self.n_out, 1, None)
        check_int("d_model", self.d_model, 1, 65536)
        check_int("n_layers", self.n_layers, 1, 256)
        check_int("n_heads", self.n_heads, 1, self.d_model)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model = {self.d_model} must be a multiple of n_heads = {self.n_heads}")
        check_int("d_ff", self.d_ff, 1, None)
        check_float("dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_choice("input", self.input, ("linear", "tokens"))
        if self.input == "linear":
            check_int("d_in", self.d_in, 1, None)
        else:
            check_int("vocab", self.vocab, 1, None)
        if self.max_len is not None:
            check_int("max_len", self.max_len, 1, None)


@dataclass(frozen=True)
class HeadTrace:
    """One layer's attention, every head: q, k (B, H, T, d_h), v (B, H, T, d_h)."""

    q: Tensor
    k: Tensor
    v: Tensor
    attention: Attention  # scores, weights (B, H, T, T), output


class Block(nn.Module):
    """Pre-LayerNorm: h + proj(attention(ln1(h))), then h + ff(ln2(h)). Dropout sits where
    the authors' deep model has it in the feed-forward branch (after the GELU and after the
    second linear map); their dropout on the attention weights is left out (PyTorch's fused
    CPU attention has none)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        # separate maps so that routing (q, k) and values (v) can be trained apart
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Dropout(cfg.dropout),
                                nn.Linear(cfg.d_ff, cfg.d_model), nn.Dropout(cfg.dropout))

    def forward(self, h: Tensor, inspect: bool = False) -> tuple[Tensor, HeadTrace | None]:
        B, T, D = h.shape
        a = self.ln1(h)
        q, k, v = (m(a).view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        trace = None
        if inspect:
            att = attend(q, k, v, causal=True)
            o = att.output
            trace = HeadTrace(q, k, v, att)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0)
        h = h + self.proj(o.transpose(1, 2).reshape(B, T, D))
        h = h + self.ff(self.ln2(h))
        return h, trace


class CausalTransformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.inp = nn.Linear(cfg.d_in, cfg.d_model) if cfg.input == "linear" else nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.max_len else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.n_out)

    def forward(self, x: Tensor, *, inspect: bool = False) -> tuple[Tensor, list[HeadTrace]]:
        """x: (B, T, d_in) floats or (B, T) token ids. Returns the logits (B, T, n_out) and,
        with ``inspect``, one :class:`HeadTrace` per layer."""
        check_bool("inspect", inspect)
        if self.cfg.input == "tokens":
            if x.dtype.is_floating_point or x.dim() != 2:
                raise TypeError(f"x must be (B, T) integer token ids, got {x.dtype} of shape {tuple(x.shape)}")
            if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.cfg.vocab):
                raise ValueError(f"token ids must lie in [0, {self.cfg.vocab - 1}]")
        else:
            check_tensor("x", x, ndim=3)
            if x.shape[-1] != self.cfg.d_in:
                raise ValueError(f"x must have shape (B, T, {self.cfg.d_in}), got {tuple(x.shape)}")
            if x.dtype != self.inp.weight.dtype:
                raise TypeError(f"x has dtype {x.dtype} but the model's weights are {self.inp.weight.dtype}")
        if 0 in x.shape:
            raise ValueError(f"x must have no empty dimension, got shape {tuple(x.shape)}")
        h = self.inp(x)
        T = h.shape[1]
        if self.pos is not None:
            if T > self.cfg.max_len:
                raise ValueError(f"sequence length {T} exceeds max_len = {self.cfg.max_len}")
            h = h + self.pos(torch.arange(T, device=h.device))
        traces = []
        for block in self.blocks:
            h, tr = block(h, inspect)
            if inspect:
                traces.append(tr)
        return self.out(self.ln_f(h)), traces


def parameter_groups(model: CausalTransformer) -> dict[str, list[str]]:
    """Parameter names by role (:data:`attention_dynamics.training.ROLES`): 'routing' (query
    and key maps of every block), 'values' (value maps) and 'other' (everything else)."""
    groups = {role: [] for role in ROLES}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        role = "other"
        if parts[0] == "blocks" and parts[2] in ("q", "k"):
            role = "routing"
        elif parts[0] == "blocks" and parts[2] == "v":
            role = "values"
        groups[role].append(name)
    return groups


def make_optimizer(model: CausalTransformer, *, lr: float, weight_decay: float = 0.0,
                   rates: dict[str, float] | None = None, frozen: tuple[str, ...] = ()) -> torch.optim.AdamW:
    """AdamW with one parameter group per trainable role, in the order of ROLES, each at
    ``rates[role]`` (default ``lr``); the roles in ``frozen`` stop requiring gradients."""
    rates = dict(rates or {})
    for role in list(rates) + list(frozen):
        if role not in ROLES:
            raise ValueError(f"roles must be among {list(ROLES)}, got {role!r}")
    for role, r in rates.items():
        check_float(f"rates[{role!r}]", r, 0.0, None, low_open=True)
    names = parameter_groups(model)
    named = dict(model.named_parameters())
    groups = []
    for role in ROLES:
        if role in frozen:
            for n in names[role]:
                named[n].requires_grad_(False)
            continue
        if names[role]:
            groups.append({"params": [named[n] for n in names[role]], "lr": rates.get(role, lr), "role": role})
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def log_probs_at(model: CausalTransformer, inputs: Tensor, positions: Tensor | None = None, *,
                 inspect: bool = False) -> tuple[Tensor, list[HeadTrace]]:
    """Log-probabilities (B, P, n_out) at ``positions`` of the sequence (all when None),
    and the traces when ``inspect``."""
    logits, traces = model(inputs, inspect=inspect)
    if positions is not None:
        logits = logits[:, positions]
    return torch.log_softmax(logits, -1), traces


def sequence_metrics(model: CausalTransformer, inputs: Tensor, targets: Tensor, *,
                     dropout: bool = False) -> dict[str, float]:
    """The model's next-step predictions at every position: mean cross-entropy and
    predictive entropy (nats) and accuracy. In evaluation mode (no dropout) unless
    ``dropout``: then with dropout active, as the authors' script evaluates (it never
    calls ``model.eval()``)."""
    if dropout:
        with torch.no_grad():
            logp, _ = log_probs_at(model, inputs)
    else:
        with evaluating(model):
            logp, _ = log_probs_at(model, inputs)
    return {"loss": float(-logp.gather(-1, targets[..., None]).mean()),
            "entropy": float(-(logp.exp() * logp).sum(-1).mean()),
            "accuracy": float((logp.argmax(-1) == targets).double().mean())}


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """Evaluation mode (no dropout) and no gradients inside the block; the model's mode is
    restored after it."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def fit(model: CausalTransformer, batches: Callable[[], tuple[Tensor, Tensor]], n_steps: int, *, lr: float,
        weight_decay: float = 0.0, clip_norm: float | None = None, rates: dict[str, float] | None = None,
        frozen: tuple[str, ...] = (), positions: Tensor | None = None, callback=None, every: int = 100,
        progress: bool = False, desc: str = "training") -> History:
    """Train ``model`` for ``n_steps`` steps of AdamW (one group per role, see
    :func:`make_optimizer`), the rate decaying to zero on a cosine, the gradient norm
    clipped at ``clip_norm`` if given. Each call of ``batches()`` gives (inputs, targets), the
    targets (B, P) at ``positions`` of the sequence (every position when None); the loss is
    their mean cross-entropy. ``callback(step, params, out)`` sees ``out.info['model']``
    and ``out.info['optimizer']``. Chapters *The sticky Markov chain, deep variant* and the
    three wind-tunnel chapters (*Calibration: the model against the exact posterior*,
    *Geometry over training*, *The laws at work*)."""
    n_steps = check_int("n_steps", n_steps, 0, None)
    lr = check_float("lr", lr, 0.0, 1.0, low_open=True)
    opt = make_optimizer(model, lr=lr, weight_decay=weight_decay, rates=rates, frozen=frozen)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(n_steps, 1))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}

    def loss_fn(p):
        inputs, targets = batches()
        opt.zero_grad()
        logp, _ = log_probs_at(model, inputs, positions)
        loss = torch.nn.functional.nll_loss(logp.reshape(-1, logp.shape[-1]), targets.reshape(-1))
        loss.backward()
        return StepOutput(loss.detach(), {n: t.grad for n, t in trainable.items() if t.grad is not None},
                          {"optimizer": opt, "model": model})

    rule = TorchOptimizer(opt, scheduler=sched, clip_norm=clip_norm, clip_params=list(trainable.values()))
    return train(trainable, loss_fn, rule, n_steps, callback=callback, every=every, progress=progress, desc=desc)

