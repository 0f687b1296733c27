"""The routing law inside a trained model of either kind, attention or selective SSM (R1, R9;
chapters *One routing law for attention and selective SSMs* and *Three inference
primitives*): a small plain gradient step, and the realized change of the routing weights
against the advantage law's prediction and against the plain compatibility's
(:func:`routing_probe`); and the routing gradient in parameter space split into the
advantage channel and the row-mass channel, the one test that can tell the two laws apart
(:func:`routing_law_split`).
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from .agreement import sign_agreement
from .laws import advantage, compatibility
from .tasks.primitives import Batch
from .ssm import SSMModel
from .transformer import CausalTransformer, log_probs_at
from .validation import check_choice, check_float, check_float_list

__all__ = ["routing_probe", "routing_law_split"]


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
    return [n for n in model.parameter_roles()["routing"] if n.startswith(f"blocks.{layer}.")]


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
            row = {"layer": layer + 1, "lr": lr, "move": move, "rows_with_a_mean": float(rows.double().mean())}
            for law, pred, where in (("advantage", adv, visible & rows[..., None]), ("b", b, visible)):
                # weighted by the movement: an entry that barely moved says little
                a = sign_agreement(change, -pred, where=where, weights=change.abs(), rel_tol=rel_tol)
                row[f"follows_{law}"], row[f"weighted_{law}"] = a.rate, a.weighted
                row[f"cosine_{law}"] = float(torch.nn.functional.cosine_similarity(
                    change[a.compared], -pred[a.compared], dim=0))
                row[f"n_{law}"] = a.n
            out.append(row)
    return out


def _routing_split(w: Tensor, b: Tensor, params: list[Tensor], mass_tol: float) -> dict:
    """The exact split of one layer's routing gradient in parameter space (the core of
    :func:`routing_law_split`, for any differentiable routing map).

    ``w`` (..., T, T): routing weights, computed from ``params`` with the graph kept (only
    entries j <= t count; the map must give zero weight and zero derivative above the
    diagonal, as attention's and the SSM's do); ``b`` (..., T, T): dL/dw, detached. With
    r_t = sum_j w_tj, a row is *included* where |r_t| >= mass_tol sum_j |w_tj| > 0; there
    E_w[b]_t = sum_j w_tj b_tj / r_t and A = b - E_w[b]; on the other (*excluded*) rows no
    mean is subtracted (E_w[b] := 0, A = b). So b = A + c exactly, c = E_w[b] 1 on included
    rows and 0 elsewhere, and with e = b on excluded rows (0 elsewhere) the vector-Jacobian
    products (J = dw/dtheta, all ``params`` concatenated in order, flattened) are

    - 'true' = J^T b (the routing gradient), 'advantage' = J^T A, 'row_mass' = J^T c
      (= sum_t E_w[b]_t dr_t/dtheta over included rows), 'excluded' = J^T e;
      J^T b = J^T A + J^T c up to rounding (linearity);

    and 'A' (zero above the diagonal), 'rows' (bool, (..., T)), 'visible' (bool, (..., T, T)).
    """
    T = w.shape[-1]
    visible = torch.ones(T, T, dtype=torch.bool, device=w.device).tril().expand_as(w)
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    wv = torch.where(visible, w.detach(), zero)
    b = torch.where(visible, b.detach(), zero)
    size = wv.abs().sum(-1)
    rows = (wv.sum(-1).abs() >= mass_tol * size) & (size > 0)  # an all-zero row has no mean
    inside = visible & rows[..., None]
    A = torch.where(inside, _mean_advantage(wv, b, rows), b)  # b on excluded rows, 0 above the diagonal
    c = torch.where(inside, b - A, zero)
    e = torch.where(inside, zero, b)

    def vjp(g: Tensor) -> Tensor:
        grads = torch.autograd.grad(w, params, grad_outputs=g, retain_graph=True, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if d is None else d).reshape(-1) for p, d in zip(params, grads)])

    return {"true": vjp(b), "advantage": vjp(A), "row_mass": vjp(c), "excluded": vjp(e), "A": A, "b": b,
            "rows": rows, "visible": visible}


def _split_report(split: dict) -> dict:
    """The numbers :func:`routing_law_split` reports from one :func:`_routing_split`."""
    g, a, m, e = (split[k] for k in ("true", "advantage", "row_mass", "excluded"))
    n = lambda x: float(torch.linalg.vector_norm(x))  # noqa: E731
    nan = float("nan")
    inside = split["visible"] & split["rows"][..., None]
    differs = (torch.sign(split["b"]) != torch.sign(split["A"])) & inside
    n_in = int(inside.sum())
    rest = n(g - e)  # |J^T (b on included rows)|
    return {
        "cos_true_advantage": float(g @ a) / (n(g) * n(a)) if n(g) > 0 and n(a) > 0 else nan,
        "row_mass_ratio": n(m) / n(g) if n(g) > 0 else nan,
        "row_mass_share": n(m) ** 2 / (n(a) ** 2 + n(m) ** 2) if n(a) + n(m) > 0 else nan,
        "excluded_ratio": n(e) / n(g) if n(g) > 0 else nan,
        "excluded_share": n(e) ** 2 / (rest ** 2 + n(e) ** 2) if rest + n(e) > 0 else nan,
        "split_residual": n(g - a - m) / n(g) if n(g) > 0 else nan,
        "sign_differs_share": int(differs.sum()) / n_in if n_in else nan,
        "rows_included": float(split["rows"].double().mean()),
        "n_entries": n_in,
        "grad_norm": n(g),
        "advantage_norm": n(a),  # |J^T A|: with row_mass_norm, what shares pooled over layers are made of
        "row_mass_norm": n(m),
        "excluded_norm": n(e),
        "included_norm": rest,
        "n_params": int(g.numel()),
    }


def routing_law_split(model: nn.Module, batch: Batch, *, mass_tol: float = 0.1) -> list[dict]:
    """The routing law in parameter space: for every layer, the gradient of the loss with
    respect to that layer's own routing parameters theta (its query and key maps; the SSM's
    x_proj, dt_proj, A_log) through its routing weights w (attention's alpha, the SSM's
    w_tj), J^T b with J = dw/dtheta and b_tj = u_t . v_j, u = dL/d(mixer output) (as
    :func:`routing_probe` computes it), split into the advantage channel J^T A, A = b -
    E_w[b], and the row-mass channel J^T (b - A) = sum_t E_w[b]_t dr_t/dtheta, r_t = sum_j
    w_tj. The change of w itself cannot tell the two laws apart (J^T b = J^T A whenever the
    rows of w sum to a constant); the parameters' gradient can, through the row-mass
    channel: for softmax attention r_t = 1 identically, so that channel is zero to rounding
    (``row_mass_ratio`` ~ 1e-16, ``cos_true_advantage`` = 1 to rounding) and the laws
    coincide; for unnormalized weights (the SSM's) it need not be.

    The computation runs in float64 on a copy of the model in training mode (as
    :func:`routing_probe`; ``model`` is left untouched), one forward pass with the graph
    kept, on ``batch``; vector-Jacobian products by ``torch.autograd.grad``.

    E_w[b]_t = sum_j w_tj b_tj / r_t is a mean only on rows where the weights are mostly of
    one sign, |r_t| >= ``mass_tol`` sum_j |w_tj| (then w_t = r_t pi_t with pi_t a signed
    but mostly positive distribution; softmax rows always qualify). The other rows (r_t
    near zero, weights of mixed sign, or all zero): every row enters the true gradient
    J^T b, but on an excluded row no mean is subtracted (E_w[b] := 0, A = b), so it counts
    the same in both laws and adds nothing to the row-mass channel; its part of the
    gradient, J^T e with e = b on the excluded rows, is reported apart. So J^T b = J^T A +
    J^T (b - A) exactly, and the row-mass channel is the included rows' only.

    One dict per layer (``layer`` 1-based, as :func:`routing_probe`):

    - ``cos_true_advantage``: cos(J^T b, J^T A) over the concatenated parameter vector;
    - ``row_mass_ratio``: |J^T (b - A)| / |J^T b|;
    - ``row_mass_share``: |J^T (b - A)|^2 / (|J^T A|^2 + |J^T (b - A)|^2); the two channels
      need not be orthogonal (J^T b = J^T A + J^T (b - A) but |J^T b|^2 is not the sum of
      their squares), hence this normalization, which lies in [0, 1];
    - ``excluded_ratio``: |J^T e| / |J^T b|; ``excluded_share``: |J^T e|^2 / (|J^T (b -
      e)|^2 + |J^T e|^2), the excluded rows against the included ones, normalized the same
      way (0 when every row is included, as in attention);
    - ``sign_differs_share``: the share of the visible entries (j <= t) of included rows
      where sign(b) != sign(A): only these separate the laws entry by entry;
    - ``rows_included``: the share of rows (over batch, heads or channels, and t) included;
    - ``split_residual``: |J^T b - J^T A - J^T (b - A)| / |J^T b| (rounding level: a check
      that the split is exact); ``grad_norm``: |J^T b|; ``n_entries``: the entries behind
      ``sign_differs_share``; ``n_params``: the length of theta.

    Ratios with a zero denominator (no routing gradient at all) are NaN.
    """
    if not isinstance(model, (CausalTransformer, SSMModel)):
        raise TypeError(f"model must be a CausalTransformer or an SSMModel, got {type(model).__name__}")
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.primitives.Batch, got {type(batch).__name__}")
    mass_tol = check_float("mass_tol", mass_tol, 0.0, 1.0, low_open=True, high_open=True)
    twin = copy.deepcopy(model).double()
    twin.train()
    inputs = batch.inputs.double() if batch.inputs.is_floating_point() else batch.inputs
    logp, traces = log_probs_at(twin, inputs, batch.positions, inspect=True)
    outs = [_routing(tr)[2] for tr in traces]
    loss = nn.functional.nll_loss(logp.reshape(-1, logp.shape[-1]), batch.targets.reshape(-1))
    us = torch.autograd.grad(loss, outs, retain_graph=True)  # u = dL/d(mixer output), per layer
    named = dict(twin.named_parameters())
    out = []
    for layer, (tr, u) in enumerate(zip(traces, us)):
        w, v, _ = _routing(tr)
        b = compatibility(u, v.detach())
        params = [named[n] for n in _layer_routing_parameters(twin, layer)]
        out.append({"layer": layer + 1, **_split_report(_routing_split(w, b, params, mass_tol))})
    return out
