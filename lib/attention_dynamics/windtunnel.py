"""Training and measuring a small transformer in the bijection wind tunnel (R8).

One model (:mod:`attention_dynamics.transformer`), trained on fresh samples every step with
AdamW and a cosine schedule through the library's training loop, with optional per-role
learning-rate scales ('routing': query and key maps; 'values': value maps; 'other') and
frozen roles for the ablations. :func:`measure` evaluates calibration against the exact
posterior and the geometric statistics on a fixed evaluation batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np
import torch
from torch import Tensor

from .checks import check_float, check_int
from .geometry import (attention_entropy_bits, calibration_errors, key_orthogonality, leading_coordinate, pc_shares,
                       spearman)
from .tasks.bijection import WindTunnel, bayes_entropy_bits, posterior, sample_batch, supervised_positions
from .training import History, StepOutput, TorchOptimizer, train
from .transformer import CausalTransformer, TransformerConfig, parameter_groups

__all__ = ["make_model", "make_optimizer", "supervised_log_probs", "train_wind_tunnel", "measure", "law_probe",
           "EvalSet", "eval_set"]

ROLES = ("routing", "values", "other")


def make_model(task: WindTunnel, *, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, d_ff: int | None = None,
               seed: int = 0) -> CausalTransformer:
    torch.manual_seed(check_int("seed", seed, 0, None))
    cfg = TransformerConfig(n_out=task.V, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                            d_ff=4 * d_model if d_ff is None else d_ff, dropout=0.0, input="tokens",
                            vocab=task.V, max_len=task.length)
    return CausalTransformer(cfg)


def supervised_log_probs(model: CausalTransformer, tokens: Tensor, task: WindTunnel, *, inspect: bool = False):
    """Log-probabilities at the supervised positions (B, L + 1, V), and the traces."""
    logits, traces = model(tokens, inspect=inspect)
    return torch.log_softmax(logits[:, supervised_positions(task)], -1), traces


def train_wind_tunnel(model: CausalTransformer, task: WindTunnel, n_steps: int, *, batch: int = 128, lr: float = 1e-3,
                      weight_decay: float = 0.0, seed: int = 0, scales: dict[str, float] | None = None,
                      frozen: tuple[str, ...] = (), callback=None, every: int = 100, progress: bool = False,
                      desc: str = "wind tunnel") -> History:
    """Train on fresh samples every step. ``scales``: learning-rate multiplier per role;
    ``frozen``: roles that do not train (the ablations)."""
    n_steps = check_int("n_steps", n_steps, 0, None)
    lr = check_float("lr", lr, 0.0, 1.0, low_open=True)
    scales = dict(scales or {})
    for role in list(scales) + list(frozen):
        if role not in ROLES:
            raise ValueError(f"roles must be among {list(ROLES)}, got {role!r}")
    for role, sc in scales.items():
        check_float(f"scales[{role!r}]", sc, 0.0, None, low_open=True)
    opt = make_optimizer(model, lr=lr, weight_decay=weight_decay, scales=scales, frozen=frozen)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(n_steps, 1))
    gen = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}

    def loss_fn(p):
        tokens, targets = sample_batch(task, batch, gen)
        opt.zero_grad()
        logp, _ = supervised_log_probs(model, tokens, task)
        loss = torch.nn.functional.nll_loss(logp.reshape(-1, task.V), targets.reshape(-1))
        loss.backward()
        return StepOutput(loss.detach(), {n: t.grad for n, t in trainable.items() if t.grad is not None},
                          {"optimizer": opt, "model": model})

    return train(trainable, loss_fn, TorchOptimizer(opt, scheduler=sched), n_steps, callback=callback, every=every,
                 progress=progress, desc=desc)


def make_optimizer(model: CausalTransformer, *, lr: float, weight_decay: float = 0.0,
                   scales: dict[str, float] | None = None, frozen: tuple[str, ...] = ()) -> torch.optim.AdamW:
    """AdamW with one parameter group per trainable role, in the order of ROLES; frozen
    roles stop requiring gradients."""
    scales = dict(scales or {})
    names = parameter_groups(model)
    named = dict(model.named_parameters())
    groups = []
    for role in ROLES:
        if role in frozen:
            for n in names[role]:
                named[n].requires_grad_(False)
            continue
        if names[role]:
            groups.append({"params": [named[n] for n in names[role]], "lr": lr * scales.get(role, 1.0), "role": role})
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def law_probe(model: CausalTransformer, optimizer: torch.optim.AdamW, task: WindTunnel, tokens: Tensor,
              targets: Tensor, *, sgd_lr: float | None = None) -> list[dict]:
    """R1 and R2 inside the real model: one training step (a copy of the model and of the
    optimizer's state, so training is untouched) on a fixed probe batch, and per layer and
    head: how often the change of attention follows -sign(advantage) (plain and weighted by
    alpha |advantage|), the cosine between the change of the values and R2's direction
    -sum_i alpha_ij u_i, and the relative per-step change of attention, values, and of the
    routing and value weights. ``sgd_lr``: take a plain gradient step of that size instead
    of the optimizer's (AdamW) step, to see the gradient's own direction. Also reports
    'r2_error', the largest relative gap between autograd's dL/dv and R2's sum_i alpha_ij u_i."""
    import copy

    from .laws import compatibility
    from .specialization import advantage_sign_agreement

    twin = copy.deepcopy(model)
    twin.train()
    if sgd_lr is None:
        twin_params = dict(twin.named_parameters())
        opt = torch.optim.AdamW([{k: v for k, v in g.items() if k != "params"} | {"params": [twin_params[n]
                                 for n in _group_names(model, g)]} for g in optimizer.param_groups])
        opt.load_state_dict(optimizer.state_dict())
    else:
        opt = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad],
                              lr=check_float("sgd_lr", sgd_lr, 0.0, None, low_open=True))
    opt.zero_grad()
    logp, traces = supervised_log_probs(twin, tokens, task, inspect=True)
    for tr in traces:
        tr.attention.output.retain_grad()
        tr.v.retain_grad()
    loss = torch.nn.functional.nll_loss(logp.reshape(-1, task.V), targets.reshape(-1))
    loss.backward()
    before = {n: p.detach().clone() for n, p in twin.named_parameters()}
    pre = [(tr.attention.weights.detach(), tr.v.detach(), tr.attention.output.grad.detach()) for tr in traces]
    r2_errors = [float(((tr.attention.weights.detach().transpose(-1, -2) @ tr.attention.output.grad) - tr.v.grad).abs().max()
                       / tr.v.grad.abs().max().clamp_min(1e-30)) for tr in traces]
    opt.step()
    with torch.no_grad():
        _, after = supervised_log_probs(twin, tokens, task, inspect=True)
    groups = parameter_groups(twin)
    now = {n: p.detach() for n, p in twin.named_parameters()}
    out = []
    for layer, ((alpha, v, u), tr) in enumerate(zip(pre, after)):
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
            out.append({"layer": layer, "head": h, "sign_agreement": rate, "weighted_agreement": wrate,
                        "value_alignment": cos, "r2_error": r2_errors[layer],
                        "attention_change": float(d_alpha[:, h].norm() / alpha[:, h].norm()),
                        "value_change": float(d_v[:, h].norm() / v[:, h].norm()),
                        "routing_weight_change": rel["routing"], "value_weight_change": rel["values"]})
    return out


def _group_names(model: CausalTransformer, group: dict) -> list[str]:
    ids = {id(p): n for n, p in model.named_parameters()}
    return [ids[id(p)] for p in group["params"]]


@dataclass(frozen=True)
class EvalSet:
    tokens: Tensor
    targets: Tensor
    posterior: Tensor
    bayes_bits: Tensor
    pos_bits: Tensor  # (B, L + 1) the Bayes entropy of each supervised position (for correlations)


def eval_set(task: WindTunnel, n: int = 512, seed: int = 12345) -> EvalSet:
    check_int("n", n, 1, 10_000_000)
    gen = torch.Generator().manual_seed(seed)
    tokens, targets = sample_batch(task, n, gen)
    bits = bayes_entropy_bits(task)
    return EvalSet(tokens, targets, posterior(tokens, task), bits, bits[None].expand(n, -1))


def measure(model: CausalTransformer, task: WindTunnel, ev: EvalSet, *, geometry: bool = True) -> dict:
    """Calibration (bits) and, with ``geometry``, per layer: value-manifold PC shares and
    the best head's rank correlation of the leading value coordinate with the Bayes
    entropy, key orthogonality against the random baseline, and attention entropy by
    supervised position (bits), averaged over heads."""
    model.eval()
    with torch.no_grad():
        logp, traces = supervised_log_probs(model, ev.tokens, task, inspect=geometry)
    model.train()
    cal = calibration_errors(logp, ev.bayes_bits, ev.posterior)
    out = {"mae_bits": float(cal["mae"]), "model_bits": cal["model_bits"].numpy(),
           "abs_error_bits": cal["abs_error_bits"].numpy(), "kl_bits": cal["kl_bits"].numpy(),
           "loss": float(torch.nn.functional.nll_loss(logp.reshape(-1, task.V), ev.targets.reshape(-1)))}
    if not geometry:
        return out
    pos = supervised_positions(task)
    key_pos = torch.arange(0, 2 * task.L, 2)
    layers = []
    for tr in traces:
        H = tr.v.shape[1]
        shares, rhos, orth, attn = [], [], [], []
        for h in range(H):
            vals = tr.v[:, h][:, pos].reshape(-1, tr.v.shape[-1])  # values at the supervised positions
            shares.append(pc_shares(vals, 3))
            rhos.append(spearman(leading_coordinate(vals).numpy(), ev.pos_bits.reshape(-1).numpy()))
            keys = tr.k[:, h][:, key_pos].reshape(-1, tr.k.shape[-1])
            orth.append(key_orthogonality(keys, ev.tokens[:, key_pos].reshape(-1), task.V))
            attn.append(attention_entropy_bits(tr.attention.weights[:, h][:, pos]).mean(0).numpy())
        best = int(np.argmax(np.abs(rhos)))
        layers.append({
            "pc_shares": np.mean(shares, 0), "rho_best": float(abs(rhos[best])), "rho_best_head": best,
            "rho_mean": float(np.mean(np.abs(rhos))), "key_abs_cos": float(np.mean([o[0] for o in orth])),
            "key_abs_cos_random": float(orth[0][1]), "attention_bits": np.mean(attn, 0),
            "attention_maps": tr.attention.weights[:, :, pos].mean(0).numpy(),  # (H, P, T) mean over samples
        })
    out["layers"] = layers
    return out
