"""The routing law inside a trained model of either kind, attention or selective SSM (R1, R9;
chapters *One routing law for attention and selective SSMs* and *Three inference
primitives*): a small plain gradient step, and the realized change of the routing weights
against the advantage law's prediction and against the plain compatibility's.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from .laws import advantage, compatibility
from .tasks.primitives import Batch
from .ssm import SSMModel
from .transformer import CausalTransformer, log_probs_at, parameter_groups
from .validation import check_choice, check_float_list

__all__ = ["routing_probe"]


def _routing(trace) -> tuple[Tensor, Tensor, Tensor]:
    """(weights, values, output) of an attention head trace or an SSM trace."""
    if hasattr(trace, "attention"):
        return trace.attention.weights, trace.v, trace.attention.output
    return trace.weights, trace.v, trace.output


def _mean_advantage(w: Tensor, b: Tensor, rows: Tensor) -> Tensor:
    """b - E_w[b] with E_w[b] = sum_j w_tj b_tj / sum_j w_tj, the w-weighted mean (for
    softmax attention the usual advantage); ``rows``: where the weights' sum is far enough
    from zero for the mean to mean something."""
    total = w.sum(-1, keepdim=True)
    mean = (w * b).sum(-1, keepdim=True) / torch.where(rows[..., None], total, torch.ones_like(total))
    return b - mean


def _layer_routing_parameters(model: nn.Module, layer: int) -> list[str]:
    """The names of the routing parameters of one block (queries and keys; the SSM's
    x_proj, dt_proj and A_log)."""
    return [n for n in parameter_groups(model)["routing"] if n.startswith(f"blocks.{layer}.")]


def _routing_state(twin: nn.Module, inputs, batch: Batch):
    """Forward with traces and backward: per layer (w, b, advantage, visible, rows)."""
    twin.zero_grad()
    logp, traces = log_probs_at(twin, inputs, batch.positions, inspect=True)
    outs = [_routing(tr)[2] for tr in traces]
    for o in outs:
        o.retain_grad()
    nn.functional.nll_loss(logp.reshape(-1, logp.shape[-1]), batch.targets.reshape(-1)).backward()
    state = []
    for tr, o in zip(traces, outs):
        w, v, _ = _routing(tr)
        w = w.detach()
        b = compatibility(o.grad, v.detach())
        T = w.shape[-1]
        visible = torch.ones(T, T, dtype=torch.bool).tril().expand_as(w)
        rows = w.sum(-1).abs() >= 0.1 * w.abs().sum(-1)
        adv = advantage(w, b) if hasattr(tr, "attention") else _mean_advantage(w, b, rows)
        state.append((w, b, adv, visible, rows))
    return state


def routing_probe(model: nn.Module, batch: Batch, lrs, *, move: str = "routing", rel_tol: float = 1e-6) -> list[dict]:
    """The routing law inside a trained model: one plain gradient step of each size in
    ``lrs`` on a float64 copy of the model, on ``batch``, and for every layer the realized
    change of its routing weights (attention's alpha, the SSM's w) against two predictions,
    -advantage = -(b - E_w[b]) and -b, where b_tj = u_t . v_j with u = dL/d(mixer output).
    ``move="routing"``: the step moves only that layer's own routing parameters (its query
    and key maps; the SSM's x_proj, dt_proj, A_log), so that the change of its weights is
    the routing gradient's doing and not the drift of its inputs; ``move="all"``: every
    parameter moves (a training step). Reported: the share of entries whose change has the
    predicted sign (``follows_*``), the same share weighted by how far each entry moved
    (``weighted_*``) and the cosine between change and prediction (``cosine_*``). Entries
    with j <= t whose change and prediction exceed ``rel_tol`` times their largest enter;
    for the SSM only rows whose weights sum to at least a tenth of their absolute sum (where
    E_w[b] is a mean) enter the advantage comparison. One row per layer and step size."""
    if not isinstance(model, (CausalTransformer, SSMModel)):
        raise TypeError(f"model must be a CausalTransformer or an SSMModel, got {type(model).__name__}")
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.primitives.Batch, got {type(batch).__name__}")
    lrs = check_float_list("lrs", lrs, 0.0, None, low_open=True)
    check_choice("move", move, ("routing", "all"))
    # float64: a step of 1e-4 moves the weights by less than float32 resolves
    twin = copy.deepcopy(model).double()
    twin.train()
    inputs = batch.inputs.double() if batch.inputs.is_floating_point() else batch.inputs
    before = _routing_state(twin, inputs, batch)
    named = dict(twin.named_parameters())
    grads = {n: p.grad.detach().clone() for n, p in named.items() if p.grad is not None}
    start = {n: p.detach().clone() for n, p in named.items()}
    out = []

    def step(lr: float, moving) -> list:
        with torch.no_grad():
            for n, p in named.items():
                p.copy_(start[n] - lr * grads[n] if n in moving and n in grads else start[n])
            return log_probs_at(twin, inputs, batch.positions, inspect=True)[1]

    for lr in lrs:
        stepped_all = step(lr, grads) if move == "all" else None
        for layer, (w, b, adv, visible, rows) in enumerate(before):
            after = stepped_all or step(lr, _layer_routing_parameters(twin, layer))
            change = _routing(after[layer])[0] - w
            keep = visible & (change.abs() > rel_tol * change.abs().max())
            row = {"layer": layer + 1, "lr": lr, "move": move, "rows_with_a_mean": float(rows.double().mean())}
            for law, pred, where in (("advantage", adv, keep & rows[..., None]), ("b", b, keep)):
                where = where & (pred.abs() > rel_tol * pred.abs().max())
                agree = (torch.sign(change) == -torch.sign(pred))[where].double()
                moved = change.abs()[where]
                row[f"follows_{law}"] = float(agree.mean())
                row[f"weighted_{law}"] = float((agree * moved).sum() / moved.sum())
                row[f"cosine_{law}"] = float(torch.nn.functional.cosine_similarity(change[where], -pred[where], dim=0))
                row[f"n_{law}"] = int(where.sum())
            out.append(row)
    return out
