"""One small causal transformer, for the deep sticky-chain variant and the wind tunnel.

Pre-LayerNorm blocks (multi-head causal self-attention, then a GELU feed-forward), a final
LayerNorm and a linear read-out. Inputs are either real vectors (a linear input layer, as in
the sticky chain) or tokens (an embedding, plus learned positions, as in the wind tunnel).

Training runs attention through :func:`causal_attention`: a compiled kernel
(:mod:`attention_dynamics.native`) on the processors where it measured faster, else
PyTorch's fused ``scaled_dot_product_attention``; both compute the same function. With ``inspect=True`` the same forward pass computes attention explicitly
with :func:`attention_dynamics.head.attend` and returns every head's scores, weights,
queries, keys and values; the two paths agree to rounding (tested).

:func:`fit` is the one way every transformer of the book trains (the deep sticky-chain
variant and the wind tunnel): AdamW with one parameter group per role, a cosine schedule to
zero, optional clipping, through :func:`attention_dynamics.training.train`.
"""
from __future__ import annotations

import copy

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .head import Attention, attend
from .native import causal_attention_kernel, dispatch, in_threads, transposed_padded
from .training import ROLES, History, StepOutput, TorchOptimizer, train
from .validation import check_bool, check_choice, check_float, check_int, check_model_input

__all__ = ["TransformerConfig", "CausalTransformer", "HeadTrace", "make_optimizer", "fit",
           "evaluating", "log_probs_at", "sequence_metrics", "causal_attention"]


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


_QB, _JB = 8, 16  # the kernel's query block and key chunk (causal_attention.c)


class _CompiledCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        lib = causal_attention_kernel(D)
        S, TP, scale = B * H, -(-T // _JB) * _JB, 1.0 / math.sqrt(D)
        qs, ks, vs = (x.reshape(S, T, D).contiguous() for x in (q, k, v))
        kt = transposed_padded(ks, TP)
        o, lse = torch.empty_like(qs), torch.empty(S, T)
        work = torch.empty(S, 2 * _QB * TP)

        def run(a, b):
            lib.attention_forward(b - a, T, TP, qs[a].data_ptr(), kt[a].data_ptr(), vs[a].data_ptr(),
                                  o[a].data_ptr(), lse[a].data_ptr(), scale, work[a].data_ptr())

        in_threads(run, S)
        ctx.save_for_backward(qs, ks, vs, kt, o, lse)
        ctx.shape = (B, H, T, D)
        return o.view(B, H, T, D)

    @staticmethod
    def backward(ctx, grad_out):
        qs, ks, vs, kt, o, lse = ctx.saved_tensors
        B, H, T, D = ctx.shape
        lib = causal_attention_kernel(D)
        S, TP = B * H, kt.shape[-1]
        vt = transposed_padded(vs, TP)
        g = grad_out.reshape(S, T, D).contiguous()
        dq, dk, dv = torch.empty_like(qs), torch.zeros_like(ks), torch.zeros_like(vs)
        work = torch.empty(S, 2 * _QB * TP)

        def run(a, b):
            lib.attention_backward(b - a, T, TP, qs[a].data_ptr(), ks[a].data_ptr(), kt[a].data_ptr(),
                                   vt[a].data_ptr(), o[a].data_ptr(), g[a].data_ptr(), lse[a].data_ptr(),
                                   dq[a].data_ptr(), dk[a].data_ptr(), dv[a].data_ptr(), 1.0 / math.sqrt(D),
                                   work[a].data_ptr())

        in_threads(run, S)
        return dq.view(B, H, T, D), dk.view(B, H, T, D), dv.view(B, H, T, D)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, *, compiled: bool | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v for (B, H, T, d) inputs, differentiable:
    through the compiled kernel (float32 on the CPU, head dimension 4, 8, 16, 32 or 64;
    ``compiled=None`` uses it where it is the faster path measured on this processor,
    :func:`attention_dynamics.native.chooses`, and it builds; False never), else through
    PyTorch's fused attention. The kernel walks the keys of each query in long vector loops,
    which pays when the head dimension is small, on some processors."""
    fits = (q.dtype == torch.float32 and q.device.type == "cpu" and q.dim() == 4 and k.shape == q.shape
            and v.shape == q.shape and q.numel() > 0 and q.shape[-1] in (4, 8, 16, 32, 64))
    if compiled and not fits:
        raise ValueError("the compiled attention takes float32 CPU tensors q, k, v of one shape (B, H, T, d) "
                         f"with d in 4, 8, 16, 32, 64; got {q.dtype} {tuple(q.shape)}")
    return dispatch("causal_attention", compiled, fits, lambda: _CompiledCausalAttention.apply(q, k, v),
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0))


class Dropout(nn.Module):
    """Inverted dropout, as ``nn.Dropout``: each entry kept with probability 1 - p and scaled
    by 1 / (1 - p) in training mode, the identity in evaluation mode. The mask comes from
    ``torch.rand``, several times faster on the CPU than ``nn.Dropout``'s Bernoulli draws."""

    def __init__(self, p: float):
        super().__init__()
        self.p = check_float("p", p, 0.0, 1.0, high_open=True)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return x * ((torch.rand_like(x) >= self.p) * (1.0 / (1.0 - self.p)))


class Block(nn.Module):
    """Pre-LayerNorm: h + proj(attention(ln1(h))), then h + ff(ln2(h)). Dropout sits where
    the authors' deep model has it in the feed-forward branch (after the GELU and after the
    second linear map); their dropout on the attention weights is left out (the fused
    attention kernels, ours and PyTorch's, have none)."""

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
        self.ff = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), Dropout(cfg.dropout),
                                nn.Linear(cfg.d_ff, cfg.d_model), Dropout(cfg.dropout))

    def forward(self, h: Tensor, inspect: bool = False, weights: Tensor | None = None,
                values: Tensor | None = None) -> tuple[Tensor, HeadTrace | None]:
        """``weights``: attention weights (B, H, T, T) to mix the values with instead of the
        block's own; ``values``: values (B, H, T, d_h) instead of the block's own (the
        ablations of :meth:`CausalTransformer.freeze_channel`)."""
        B, T, D = h.shape
        a = self.ln1(h)
        q, k, v = (m(a).view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        if values is not None:
            v = values.to(q.dtype)
        trace = None
        if weights is not None:
            o = weights.to(v.dtype) @ v
            if inspect:
                att = attend(q, k, v, causal=True)
                trace = HeadTrace(q, k, v, Attention(att.scores, weights, o, att.scale, att.allowed))
        elif inspect:
            att = attend(q, k, v, causal=True)
            o = att.output
            trace = HeadTrace(q, k, v, att)
        else:
            o = causal_attention(q, k, v)
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
        check_model_input(x, self.cfg.input, vocab=self.cfg.vocab, d_in=self.cfg.d_in,
                          dtype=self.inp.weight.dtype)
        h = self.inp(x)
        T = h.shape[1]
        if self.pos is not None:
            if T > self.cfg.max_len:
                raise ValueError(f"sequence length {T} exceeds max_len = {self.cfg.max_len}")
            h = h + self.pos(torch.arange(T, device=h.device))
        frozen = self.__dict__.get("_frozen_channel")
        patterns = values = [None] * len(self.blocks)
        if frozen is not None:
            channel, source = frozen
            with torch.no_grad():
                source_traces = source(x, inspect=True)[1]
            if channel == "pattern":
                patterns = [tr.attention.weights for tr in source_traces]
            else:
                values = [tr.v for tr in source_traces]
        traces = []
        for block, pattern, value in zip(self.blocks, patterns, values):
            h, tr = block(h, inspect, pattern, value)
            if inspect:
                traces.append(tr)
        return self.out(self.ln_f(h)), traces

    def parameter_roles(self) -> dict[str, list[str]]:
        """Parameter names by role (:data:`attention_dynamics.training.ROLES`): 'routing'
        (query and key maps of every block), 'values' (value maps) and 'other' (everything
        else). Every model :func:`fit` trains says its roles this way (the SSM of R9 too)."""
        roles = {role: [] for role in ROLES}
        for name, _ in self.named_parameters():
            parts = name.split(".")
            role = "other"
            if parts[0] == "blocks" and parts[2] in ("q", "k"):
                role = "routing"
            elif parts[0] == "blocks" and parts[2] == "v":
                role = "values"
            roles[role].append(name)
        return roles

    def freeze_channel(self, channel: str) -> None:
        """Switch one of the two channels of the gradient laws off, whatever else learns (the
        ablations of chapter *The laws at work*): from now on every layer takes its attention
        weights (``"pattern"``, R1's channel) or its values (``"values"``, R2's channel) from a
        frozen copy of the model as it is now, run on the same input. Freezing W_Q, W_K or W_V
        alone would not do it: the embeddings, positions and LayerNorms that feed them still
        learn, and re-learn the channel through a fixed linear map. The maps the frozen copy
        replaces then receive no gradient. The copy is not a submodule: it is neither trained
        nor saved with the model's state."""
        check_choice("channel", channel, ("pattern", "values"))
        if "_frozen_channel" in self.__dict__:
            raise ValueError(f"a channel is frozen already ({self.__dict__['_frozen_channel'][0]!r}); freeze one per model")
        source = copy.deepcopy(self).eval()
        for p in source.parameters():
            p.requires_grad_(False)
        self.__dict__["_frozen_channel"] = (channel, source)


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
    names = model.parameter_roles()
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

