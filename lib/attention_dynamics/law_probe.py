"""The two laws inside a trained transformer (R1, R2 at work; chapter *The laws at work*).

One training step is taken on a copy of the model (and of its optimizer's state), on a
fixed probe batch, and the realized change of every head's attention weights and values
is compared with what the laws say about the gradient.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import Tensor

from .laws import compatibility
from .specialization import advantage_sign_agreement
from .tasks.bijection import WindTunnel
from .transformer import CausalTransformer, parameter_groups
from .validation import check_float
from .windtunnel import supervised_log_probs

__all__ = ["law_probe"]


def law_probe(model: CausalTransformer, optimizer: torch.optim.AdamW, task: WindTunnel, tokens: Tensor,
              targets: Tensor, *, sgd_lr: float | None = None) -> list[dict]:
    """R1 and R2 inside the real model: one training step (a copy of the model and of the
    optimizer's state, so training is untouched) on a fixed probe batch, and per layer and
    head: the change of the scores against R1's -dL/ds (the sign agreement of the centred
    change Delta s - mean_j Delta s with -dL/ds, entry by entry, and their cosine: each row
    is centred because adding a constant to a row of scores changes nothing), how often the
    change of attention follows -sign(advantage) (plain and weighted by alpha |advantage|),
    the cosine between the change of the values and R2's direction -sum_i alpha_ij u_i, and
    the relative per-step change of attention, values, and of the routing and value weights. ``sgd_lr``: take a plain gradient step of that size instead
    of the optimizer's (AdamW) step, to see the gradient's own direction. Also reports
    'r2_error', the largest relative gap between autograd's dL/dv and R2's sum_i alpha_ij u_i."""
    twin = copy.deepcopy(model)
    twin.train()
    if sgd_lr is None:
        twin_params = dict(twin.named_parameters())
        opt = torch.optim.AdamW([{k: v for k, v in g.items() if k != "params"} | {"params": [twin_params[n]
                                 for n in _group_names(model, g)]} for g in optimizer.param_groups])
        # a deep copy: load_state_dict keeps the very tensors of the moment estimates,
        # which the probe's step would then change inside the training optimizer
        opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    else:
        opt = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad],
                              lr=check_float("sgd_lr", sgd_lr, 0.0, None, low_open=True))
    opt.zero_grad()
    logp, traces = supervised_log_probs(twin, tokens, task, inspect=True)
    for tr in traces:
        tr.attention.output.retain_grad()
        tr.attention.scores.retain_grad()
        tr.v.retain_grad()
    loss = torch.nn.functional.nll_loss(logp.reshape(-1, task.V), targets.reshape(-1))
    loss.backward()
    before = {n: p.detach().clone() for n, p in twin.named_parameters()}
    pre = [(tr.attention.weights.detach(), tr.v.detach(), tr.attention.output.grad.detach()) for tr in traces]
    scores = [(tr.attention.scores.detach(), tr.attention.scores.grad.detach()) for tr in traces]
    r2_errors = [float(((tr.attention.weights.detach().transpose(-1, -2) @ tr.attention.output.grad) - tr.v.grad).abs().max()
                       / tr.v.grad.abs().max().clamp_min(1e-30)) for tr in traces]
    opt.step()
    with torch.no_grad():
        _, after = supervised_log_probs(twin, tokens, task, inspect=True)
    groups = parameter_groups(twin)
    now = {n: p.detach() for n, p in twin.named_parameters()}
    out = []
    for layer, ((alpha, v, u), (s0, ds), tr) in enumerate(zip(pre, scores, after)):
        score_change = _centred_change(s0, tr.attention.scores)
        b = compatibility(u, v)
        d_alpha = tr.attention.weights - alpha
        d_v = tr.v - v
        r2 = -(alpha.transpose(-1, -2) @ u)
        prefix = f"blocks.{layer}."
        rel = {}
        for role in ("routing", "values"):
            names = [n for n in groups[role] if n.startswith(prefix)]
            num = sum(float((now[n] - before[n]).norm() ** 2) for n in names)
            den = sum(float(before[n].norm() ** 2) for n in names)
            rel[role] = math.sqrt(num / den) if den > 0 else float("nan")

        for h in range(alpha.shape[1]):
            rate, wrate, _ = advantage_sign_agreement(alpha[:, h], b[:, h], d_alpha[:, h])
            cos = torch.nn.functional.cosine_similarity(d_v[:, h].reshape(1, -1), r2[:, h].reshape(1, -1)).item()
            s_rate, s_cos = _score_agreement(score_change[:, h], -ds[:, h])
            out.append({"layer": layer, "head": h, "score_sign_agreement": s_rate, "score_cosine": s_cos,
                        "sign_agreement": rate, "weighted_agreement": wrate,
                        "value_alignment": cos, "r2_error": r2_errors[layer],
                        "attention_change": float(d_alpha[:, h].norm() / alpha[:, h].norm()),
                        "value_change": float(d_v[:, h].norm() / v[:, h].norm()),
                        "routing_weight_change": rel["routing"], "value_weight_change": rel["values"]})
    return out


def _centred_change(s0: Tensor, s1: Tensor) -> Tensor:
    """s1 - s0 at the visible entries, each row's mean over its visible entries removed; 0
    at the hidden (future) ones."""
    visible = torch.isfinite(s0)
    d = torch.where(visible, s1 - s0, torch.zeros((), dtype=s0.dtype))
    count = visible.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(visible, d - d.sum(-1, keepdim=True) / count, torch.zeros((), dtype=s0.dtype))


def _score_agreement(change: Tensor, direction: Tensor, rel_tol: float = 1e-6) -> tuple[float, float]:
    """How often the change has the sign of the direction, over the entries where both are
    measurably non-zero, and the cosine between the two."""
    keep = (direction.abs() > rel_tol * direction.abs().max()) & (change.abs() > rel_tol * change.abs().max())
    rate = float((torch.sign(change) == torch.sign(direction))[keep].double().mean()) if bool(keep.any()) else float("nan")
    cos = torch.nn.functional.cosine_similarity(change.reshape(1, -1), direction.reshape(1, -1)).item()
    return rate, cos


def _group_names(model: CausalTransformer, group: dict) -> list[str]:
    ids = {id(p): n for n, p in model.named_parameters()}
    return [ids[id(p)] for p in group["params"]]
