"""The two laws inside a trained transformer (R1, R2 at work; chapter *The laws at work*).

One training step is taken on a copy of the model (and of its optimizer's state), on a
fixed probe batch, and the realized change of every head's attention weights and values
is compared with what the laws say about the gradient (:func:`law_probe`).

Inside a parameterized model the scores are not free: after a plain gradient step on the
parameters, Delta s = -eta J J^T g + O(eta^2), g = dL/ds, J the Jacobian of the scores in
the parameters moved. :func:`kernel_law_probe` measures the laws in situ (R1, R2 against
autograd), checks that first-order prediction against the realized step, and reports how
much of the free-score law -g the kernel J J^T lets through. Its arithmetic is factored
into helpers that work on any differentiable function (a free-score toy included):
:func:`jacobian_vector_product`, :func:`realized_changes`, :func:`centre_rows`,
:func:`first_order_error`, :func:`loglog_slope`, :func:`kernel_cosine`,
:func:`supervised_rows`, :func:`tuple_ceiling`.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from .agreement import sign_agreement
from .laws import compatibility, routing_gradient, value_gradient
from .specialization import advantage_sign_agreement
from .stats import line_fit
from .tasks.bijection import WindTunnel
from .transformer import CausalTransformer
from .validation import check_float, check_float_list, check_tensor
from .windtunnel import supervised_log_probs

__all__ = ["law_probe", "kernel_law_probe", "jacobian_vector_product", "realized_changes", "centre_rows",
           "first_order_error", "loglog_slope", "kernel_cosine", "supervised_rows", "tuple_ceiling"]


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
    opt = _twin_optimizer(model, twin, optimizer, sgd_lr)
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
    groups = twin.parameter_roles()
    now = {n: p.detach() for n, p in twin.named_parameters()}
    out = []
    for layer, ((alpha, v, u), (s0, ds), tr) in enumerate(zip(pre, scores, after)):
        score_change = _centred_change(s0, tr.attention.scores)
        b = compatibility(u, v)
        d_alpha = tr.attention.weights - alpha
        d_v = tr.v - v
        r2 = -(alpha.transpose(-1, -2) @ u)
        rel = {role: _relative_change([n for n in groups[role] if n.startswith(f"blocks.{layer}.")], before, now)
               for role in ("routing", "values")}
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


def _twin_optimizer(model: CausalTransformer, twin: CausalTransformer, optimizer: torch.optim.AdamW,
                    sgd_lr: float | None) -> torch.optim.Optimizer:
    """The optimizer of the probe's step on ``twin``: a copy of the training AdamW with its
    state, or plain SGD of size ``sgd_lr``."""
    if sgd_lr is not None:
        return torch.optim.SGD([p for p in twin.parameters() if p.requires_grad],
                               lr=check_float("sgd_lr", sgd_lr, 0.0, None, low_open=True))
    twin_params = dict(twin.named_parameters())
    opt = torch.optim.AdamW([{k: v for k, v in g.items() if k != "params"} | {"params": [twin_params[n]
                             for n in _group_names(model, g)]} for g in optimizer.param_groups])
    # a deep copy: load_state_dict keeps the very tensors of the moment estimates,
    # which the probe's step would then change inside the training optimizer
    opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    return opt


def _relative_change(names: list[str], before: dict[str, Tensor], now: dict[str, Tensor]) -> float:
    """|theta_now - theta_before| / |theta_before| over the parameters ``names`` together."""
    num = sum(float((now[n] - before[n]).norm() ** 2) for n in names)
    den = sum(float(before[n].norm() ** 2) for n in names)
    return math.sqrt(num / den) if den > 0 else float("nan")


def _centred_change(s0: Tensor, s1: Tensor) -> Tensor:
    """s1 - s0 at the visible entries, each row's mean over its visible entries removed; 0
    at the hidden (future) ones."""
    visible = torch.isfinite(s0)
    d = torch.where(visible, s1 - s0, torch.zeros((), dtype=s0.dtype))
    count = visible.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(visible, d - d.sum(-1, keepdim=True) / count, torch.zeros((), dtype=s0.dtype))


def _score_agreement(change: Tensor, direction: Tensor, rel_tol: float = 1e-6) -> tuple[float, float]:
    """How often the change has the sign of the direction (unweighted: every entry of the
    scores counts once), and the cosine between the two over all entries."""
    rate = sign_agreement(change, direction, rel_tol=rel_tol).rate
    cos = torch.nn.functional.cosine_similarity(change.reshape(1, -1), direction.reshape(1, -1)).item()
    return rate, cos


def _group_names(model: CausalTransformer, group: dict) -> list[str]:
    ids = {id(p): n for n, p in model.named_parameters()}
    return [ids[id(p)] for p in group["params"]]


# ---------------------------------------------------------------------------------------
# The laws through the parameterization: Delta s = -eta J J^T g + O(eta^2)
# ---------------------------------------------------------------------------------------

_EPS64 = float(torch.finfo(torch.float64).eps)


def jacobian_vector_product(outputs: Sequence[Tensor], params: Sequence[Tensor],
                            tangents: Sequence[Tensor]) -> list[Tensor]:
    """J t exactly (to rounding), J the Jacobian of ``outputs`` (computed from ``params``
    with a graph) in ``params``: the double-backward trick. With w a free cotangent,
    J^T w is linear in w, and d/dw [(J^T w) . t] = J t. Entries of an output that do not
    depend on the parameters (the hidden scores, -inf) get 0. The forward graph is kept, so
    several products can be taken from one forward pass."""
    outputs, params, tangents = list(outputs), list(params), list(tangents)
    if len(params) != len(tangents):
        raise ValueError(f"params and tangents must pair up, got {len(params)} params and {len(tangents)} tangents")
    for i, (p, t) in enumerate(zip(params, tangents)):
        if t.shape != p.shape:
            raise ValueError(f"tangents[{i}] must have the shape of params[{i}] {tuple(p.shape)}, got {tuple(t.shape)}")
    dummies = [torch.zeros_like(torch.where(torch.isfinite(o), o, 0.0).detach(), requires_grad=True) for o in outputs]
    live = [i for i, o in enumerate(outputs) if o.requires_grad]  # the others do not depend on params
    if not live:
        return [d.detach() for d in dummies]
    vjps = torch.autograd.grad([outputs[i] for i in live], params, grad_outputs=[dummies[i] for i in live],
                               create_graph=True, allow_unused=True)
    terms = [(v * t).sum() for v, t in zip(vjps, tangents) if v is not None and v.requires_grad]
    if not terms:
        return [d.detach() for d in dummies]
    got = torch.autograd.grad(sum(terms), dummies, allow_unused=True)
    return [d.detach() if g is None else g.detach() for d, g in zip(dummies, got)]


def realized_changes(outputs_fn: Callable[[], Sequence[Tensor]], params: Sequence[Tensor],
                     direction: Sequence[Tensor], lrs: Sequence[float]) -> list[list[Tensor]]:
    """The realized change of ``outputs_fn()`` after the plain step params <- params - eta
    direction, for each eta of ``lrs``: one list of tensors (after - before) per eta. The
    parameters are restored exactly after each step. Entries that are not finite before
    the step (hidden scores, -inf) get 0. The parameters are written in place, which
    invalidates autograd graphs built on them: take every gradient and product first."""
    params, direction = list(params), list(direction)
    if len(params) != len(direction):
        raise ValueError(f"params and direction must pair up, got {len(params)} and {len(direction)}")
    with torch.no_grad():
        before = [o.detach().clone() for o in outputs_fn()]
        saved = [p.detach().clone() for p in params]
        out = []
        try:
            for eta in lrs:
                for p, s, d in zip(params, saved, direction):
                    p.copy_(s - eta * d)
                after = outputs_fn()
                out.append([torch.where(torch.isfinite(b), a.detach() - b, torch.zeros((), dtype=b.dtype))
                            for a, b in zip(after, before)])
        finally:
            for p, s in zip(params, saved):
                p.copy_(s)
    return out


def centre_rows(x: Tensor, visible: Tensor) -> Tensor:
    """Each row of x (..., T, S) less its mean over the row's visible entries; 0 at the hidden
    ones (adding a constant to a row of scores changes nothing)."""
    zero = torch.zeros((), dtype=x.dtype)
    x = torch.where(visible, x, zero)
    count = visible.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(visible, x - x.sum(-1, keepdim=True) / count, zero)


def _per_head(x: Tensor) -> Tensor:
    """(B, H, ...) -> (H, B * ...): one row per head."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def first_order_error(realized: Tensor, predicted: Tensor, *, visible: Tensor | None = None) -> Tensor:
    """Per head (dimension 1 of (B, H, ...) tensors): |realized - predicted| / |predicted|
    (Frobenius norms over the head's entries). With ``visible`` (scores), both are row-centred
    over the visible entries first (:func:`centre_rows`). ``predicted`` is the predicted
    change itself (e.g. -eta J J^T g), not the direction."""
    check_tensor("realized", realized, min_ndim=2, finite=False)
    check_tensor("predicted", predicted, min_ndim=2)
    if realized.shape != predicted.shape:
        raise ValueError(f"realized and predicted must have one shape, got {tuple(realized.shape)} and "
                         f"{tuple(predicted.shape)}")
    if visible is not None:
        realized, predicted = centre_rows(realized, visible), centre_rows(predicted, visible)
    return _per_head(realized - predicted).norm(dim=1) / _per_head(predicted).norm(dim=1)


def loglog_slope(lrs: Sequence[float], errors: Sequence[float]) -> float:
    """Least-squares slope of log(error) against log(eta): 1 for a first-order prediction
    (remainder O(eta^2) against an O(eta) change), 0 for an error that does not shrink.
    NaN when an error is not positive and finite."""
    e = np.asarray([float(v) for v in errors])
    if len(e) < 2 or not bool((np.isfinite(e) & (e > 0)).all()):
        return float("nan")
    return line_fit(np.log([float(v) for v in lrs]), np.log(e))[0]


def kernel_cosine(a: Tensor, g: Tensor, rows: Tensor | None = None) -> Tensor:
    """Per head (dimension 1 of (B, H, T, ...) tensors): the cosine between a and g over the
    entries of the rows (B, H, T) marked True in ``rows`` (all when None); NaN for a head
    where either is zero there."""
    check_tensor("a", a, min_ndim=3)
    check_tensor("g", g, min_ndim=3)
    if a.shape != g.shape:
        raise ValueError(f"a and g must have one shape, got {tuple(a.shape)} and {tuple(g.shape)}")
    if rows is not None:
        check_tensor("rows", rows, kind="bool", ndim=3)
        if rows.shape != a.shape[:3]:
            raise ValueError(f"rows must have shape {tuple(a.shape[:3])}, got {tuple(rows.shape)}")
        keep = rows.reshape(*rows.shape, *([1] * (a.dim() - 3)))
        zero = torch.zeros((), dtype=a.dtype)
        a, g = torch.where(keep, a, zero), torch.where(keep, g, zero)
    a, g = _per_head(a), _per_head(g)
    return (a * g).sum(1) / (a.norm(dim=1) * g.norm(dim=1))


def supervised_rows(g: Tensor) -> Tensor:
    """The query rows (B, H, T) where dL/ds (B, H, T, T) is not exactly zero: the rows the
    loss reads. (A first query sees one key, so its row is always zero; in the last layer
    so are the rows at unsupervised positions.)"""
    return (g != 0).any(-1)


def tuple_ceiling(g: Tensor, tokens: Tensor, rows: Tensor | None = None) -> Tensor:
    """Per head: |P g| / |g| over the visible (j <= i) entries of ``rows``, P the orthogonal
    projection onto the functions of (token_i, i, token_j, j): the entries of g in the batch
    grouped by that tuple, each replaced by its group's mean. Any vector that is such a
    function (a first-layer score change of a token transformer with absolute positions)
    has a cosine with g of at most this. g (B, H, T, T), tokens (B, T)."""
    check_tensor("g", g, ndim=4)
    check_tensor("tokens", tokens, ndim=2, kind="int")
    B, H, T, S = g.shape
    if T != S or tuple(tokens.shape) != (B, T):
        raise ValueError(f"g must be (B, H, T, T) and tokens (B, T); got {tuple(g.shape)} and {tuple(tokens.shape)}")
    if rows is None:
        rows = torch.ones(B, H, T, dtype=torch.bool)
    n_tok = int(tokens.max()) + 1
    i = torch.arange(T)
    ti = tokens[:, :, None].expand(B, T, T)
    tj = tokens[:, None, :].expand(B, T, T)
    key = ((ti * T + i[:, None]) * n_tok + tj) * T + i[None, :]  # (B, T, T): one id per tuple
    causal = i[None, :] <= i[:, None]
    out = []
    for h in range(H):
        keep = causal[None] & rows[:, h, :, None]
        vals, ids = g[:, h][keep], key[keep]
        if vals.numel() == 0 or float(vals.norm()) == 0.0:
            out.append(float("nan"))
            continue
        _, inv = torch.unique(ids, return_inverse=True)
        sums = torch.zeros(int(inv.max()) + 1, dtype=g.dtype).index_add_(0, inv, vals)
        counts = torch.zeros_like(sums).index_add_(0, inv, torch.ones_like(vals))
        out.append(float(torch.sqrt((sums * sums / counts).sum()) / vals.norm()))
    return torch.tensor(out, dtype=torch.float64)


def _probe_forward(twin: CausalTransformer, task: WindTunnel, tokens: Tensor, targets: Tensor):
    """Loss, traces and the input of every block's value map (the X of v = X W_V^T + b)."""
    xs: list[Tensor] = []
    hooks = [b.v.register_forward_pre_hook(lambda _m, inp: xs.append(inp[0])) for b in twin.blocks]
    try:
        logp, traces = supervised_log_probs(twin, tokens, task, inspect=True)
    finally:
        for hk in hooks:
            hk.remove()
    loss = torch.nn.functional.nll_loss(logp.reshape(-1, task.V), targets.reshape(-1))
    return loss, traces, xs


def _split(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, H * d) -> (B, H, T, d)."""
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)


def _check_kernel_probe(model, task, tokens, targets, lrs) -> list[float]:
    """The arguments of :func:`kernel_law_probe`, checked; the step sizes as floats."""
    if not isinstance(model, CausalTransformer):
        raise TypeError(f"model must be a CausalTransformer, got {type(model).__name__}")
    if model.cfg.input != "tokens":
        raise ValueError("model must read tokens (TransformerConfig input='tokens'), as the wind tunnel's does")
    if not isinstance(task, WindTunnel):
        raise TypeError(f"task must be a WindTunnel, got {type(task).__name__}")
    if model.cfg.n_out != task.V or model.cfg.vocab < task.V:
        raise ValueError(f"model must read and predict the task's V = {task.V} symbols, got vocab = "
                         f"{model.cfg.vocab} and n_out = {model.cfg.n_out}")
    check_tensor("tokens", tokens, ndim=2, kind="int", nonempty=True)
    check_tensor("targets", targets, ndim=2, kind="int", nonempty=True)
    B = tokens.shape[0]
    if tokens.shape[1] != task.length:
        raise ValueError(f"tokens must be (B, {task.length}) (2L + 1 for L = {task.L}), got {tuple(tokens.shape)}")
    if tuple(targets.shape) != (B, task.L + 1):
        raise ValueError(f"targets must be (B, L + 1) = ({B}, {task.L + 1}), got {tuple(targets.shape)}")
    for name, t in (("tokens", tokens), ("targets", targets)):
        if int(t.min()) < 0 or int(t.max()) >= task.V:
            raise ValueError(f"{name} must lie in [0, {task.V - 1}]")
    lrs = check_float_list("lrs", lrs, 0.0, None, low_open=True, min_len=2)
    if len(set(lrs)) != len(lrs):
        raise ValueError(f"lrs must be distinct step sizes (the first-order check compares them), got {lrs}")
    return lrs



def _insitu_errors(a: Tensor, g: Tensor, G: Tensor, u: Tensor, v: Tensor):
    """Per head: R1's and R2's closed forms against autograd's dL/ds = ``g`` and dL/dv = ``G``
    (largest gap over the largest gradient) and their a-priori float64 rounding bounds (see
    :func:`kernel_law_probe`)."""
    d_h, T = v.shape[-1], a.shape[-1]
    r1_err = _per_head(routing_gradient(a, compatibility(u, v)) - g).abs().amax(1) / _per_head(g).abs().amax(1)
    r2_err = _per_head(value_gradient(a, u) - G).abs().amax(1) / _per_head(G).abs().amax(1)
    u_norm, v_norm = u.norm(dim=-1), v.norm(dim=-1)  # (B, H, T)
    r1_scale = _per_head(a * u_norm[..., :, None] * v_norm.amax(-1)[..., None, None]).amax(1)
    r1_bound = 2 * (d_h + T + 2) * _EPS64 * r1_scale / _per_head(g).abs().amax(1)
    r2_scale = _per_head(a.transpose(-1, -2) @ u.abs()).amax(1)
    r2_bound = 2 * T * _EPS64 * r2_scale / _per_head(G).abs().amax(1)
    return r1_err, r1_bound, r2_err, r2_bound


def _wv_rounding_bound(value_map: torch.nn.Linear, xa: Tensor, g_v_flat: Tensor, k_wv: Tensor,
                       lrs: Sequence[float], H: int) -> Tensor:
    """(H, n_eta): the a-priori rounding bound of the W_V step's error (see
    :func:`kernel_law_probe`); ``xa`` the value map's input with a column of ones, rows over
    batch and positions."""
    B, _, T, _ = k_wv.shape
    D = xa.shape[1] - 1
    W = torch.cat([value_map.weight.detach(), value_map.bias.detach()[:, None]], 1)  # (D, D+1)
    xw = _per_head(_split((xa.abs() @ W.abs().T).view(B, T, D), H)).norm(dim=1)
    xxg = _per_head(_split((xa.abs() @ (xa.abs().T @ g_v_flat.abs())).view(B, T, D), H)).norm(dim=1)
    pred_norm = _per_head(k_wv).norm(dim=1)
    return torch.stack([_EPS64 * (2 * (D + 2) * xw + (B * T + D + 1) * eta * xxg) / (eta * pred_norm)
                        for eta in lrs], 1)


def _errors(steps: list, predicted: Tensor, lrs, visible: Tensor | None = None) -> Tensor:
    """(H, n_eta): the first-order error of each realized step against -eta times the
    predicted change."""
    return torch.stack([first_order_error(steps[e], -eta * predicted, visible=visible)
                        for e, eta in enumerate(lrs)], 1)


def _wv_steps(xs: list, g_v: list, H: int):
    """The W_V step per layer: v = X W^T + b with X the value map's input, so Delta v =
    -eta Xa Xa^T G exactly (Xa: X with a column of ones). Returns Xa, G flattened (heads
    side by side) and Xa Xa^T G split by head."""
    B, T, D = xs[0].shape
    xa = [torch.cat([x.detach(), torch.ones(*x.shape[:-1], 1, dtype=x.dtype)], -1).reshape(-1, D + 1) for x in xs]
    g_v_flat = [g.transpose(1, 2).reshape(B * T, D) for g in g_v]  # (B T, H d_h)
    k_wv = [_split((xa[l] @ (xa[l].T @ g_v_flat[l])).view(B, T, D), H) for l in range(len(xs))]
    return xa, g_v_flat, k_wv


def _kernel_steps(twin: CausalTransformer, scores: list, values: list, grad_theta: dict, qk_names: list):
    """The kernel-projected laws, exactly (J t by double backward from the one forward
    pass): every layer's scores and values under a step of every parameter, and each
    layer's scores under a step of its own W_Q and W_K."""
    named = dict(twin.named_parameters())
    n_layers = len(twin.blocks)
    k_all = jacobian_vector_product(scores + values, list(named.values()), [grad_theta[n] for n in named])
    k_layer = [jacobian_vector_product([scores[l]], [named[n] for n in qk_names[l]],
                                       [grad_theta[n] for n in qk_names[l]])[0] for l in range(n_layers)]
    return k_all[:n_layers], k_all[n_layers:], k_layer


def _realized_steps(twin: CausalTransformer, tokens: Tensor, grad_theta: dict, qk_names: list, lrs):
    """The realized changes of the scores and values after a step of each rate in ``lrs``:
    of every parameter together (all layers' scores, then values), of each layer's W_Q and
    W_K alone (its scores), and of each layer's W_V alone (its values)."""
    named = dict(twin.named_parameters())
    n_layers = len(twin.blocks)

    def forward_outputs():
        _, trs = twin(tokens, inspect=True)
        return [tr.attention.scores for tr in trs] + [tr.v for tr in trs]

    all_steps = realized_changes(forward_outputs, list(named.values()), [grad_theta[n] for n in named], lrs)
    layer_steps, wv_steps = [], []
    for l in range(n_layers):
        ps = [named[n] for n in qk_names[l]]
        layer_steps.append([c[0] for c in realized_changes(lambda l=l: forward_outputs()[l:l + 1], ps,
                                                           [grad_theta[n] for n in qk_names[l]], lrs)])
        vn = [f"blocks.{l}.v.weight", f"blocks.{l}.v.bias"]
        wv_steps.append([c[0] for c in realized_changes(lambda l=l: forward_outputs()[n_layers + l:n_layers + l + 1],
                                                        [named[n] for n in vn], [grad_theta[n] for n in vn], lrs)])
    return all_steps, layer_steps, wv_steps


def _split_gradients(grads, names: list[str], n_layers: int):
    """The gradients of one ``autograd.grad`` call over (parameters, scores, values, head
    outputs) split back: by parameter name, then per layer dL/ds, dL/dv and u = dL/d(head
    output), detached."""
    n = len(names)
    per_layer = [[t.detach() for t in grads[n + i * n_layers:n + (i + 1) * n_layers]] for i in range(3)]
    return dict(zip(names, grads[:n])), *per_layer


def kernel_law_probe(model: CausalTransformer, task: WindTunnel, tokens: Tensor, targets: Tensor, *,
                     lrs: Sequence[float] = (1e-3, 1e-2, 1e-1)) -> list[dict]:
    """R1 and R2 inside the model, and what a plain gradient step does to the scores and the
    values through the parameterization, per layer and head. Computed in float64 on a deep
    copy of the model in evaluation mode (no dropout, so the step is deterministic); the
    model is untouched. The loss is the mean cross-entropy at the supervised positions of
    (``tokens``, ``targets``), as in training. Every parameter may move (requires_grad flags
    of frozen roles are ignored: the probe asks what a plain step would do).

    A plain step theta <- theta - eta dL/dtheta changes the scores by
    Delta s = -eta J J^T g + O(eta^2), g = dL/ds, J = ds/dtheta for the parameters moved;
    -g (the free-score law) is followed only as far as the kernel J J^T reproduces g.

    Returns one dict per (layer, head), with keys:

    - 'layer', 'head'; 'lrs': the step sizes eta, in the order of every per-eta list below.
      The default starts a decade above the float64 floor of a realized change: Delta s is a
      difference of two forward passes, whose rounding (about 1e-8 of |eta J J^T g| at
      eta = 1e-4 on the trained wind-tunnel model, where the first-layer errors stop falling
      with eta) would otherwise flatten the first-order slope.
    - 'loss': the probe batch's loss.
    (a) the laws in situ
    - 'r1_insitu_rel_error': max |alpha (b - E_alpha b) - dL/ds| / max |dL/ds| over the head's
      entries, the closed form (laws.routing_gradient) against autograd's dL/ds.
    - 'r1_insitu_rounding_bound': its a-priori float64 rounding bound,
      2 (d_h + T + 2) eps max_ij (alpha_ij |u_i| max_k |v_k|) / max |dL/ds| (both sides form
      d_h-term dot products b and a T-term mean; |b_ik| <= |u_i| |v_k|).
    - 'r2_insitu_rel_error': max |sum_i alpha_ij u_i - dL/dv_j| / max |dL/dv| (laws.value_gradient
      against autograd).
    - 'r2_insitu_rounding_bound': 2 T eps max_jd (sum_i alpha_ij |u_id|) / max |dL/dv|.
    (b) the first-order prediction through the kernel, against the realized step
    - 'kernel_rel_error_layer': per eta, |c(Delta s) - c(-eta J_l J_l^T g)| / |c(-eta J_l J_l^T g)|
      for the step on this layer's W_Q, W_K (with their biases) alone, where the gradient is
      exactly J_l^T g; c centres each row over its visible entries. First order: ~ eta.
    - 'kernel_rel_error_all': the same for the step on all parameters, predicted
      -eta J_all dL/dtheta_all (it includes the changes of earlier layers).
    - 'values_rel_error_wv': per eta, |Delta v - (-eta X X^T G)| / |eta X X^T G| for the step on
      this layer's W_V (and bias) alone, G = dL/dv, X = [input of W_V, 1] (rows over batch and
      positions): v is linear in W_V, so this is rounding only.
    - 'values_rounding_bound_wv': per eta, the a-priori rounding bound of that error,
      eps (2 (D + 2) || |X| |W|^T || + (B T + D + 1) eta || |X| |X|^T |G| ||) / |eta X X^T G|
      (the realized v and v' are (D + 1)-term dot products, the prediction a B T-term then a
      (D + 1)-term one; W = [W_V, b] of this head, D the model width).
    - 'values_rel_error_all': per eta, the values' error for the step on all parameters,
      predicted -eta J_all^v dL/dtheta_all. First order.
    - 'kernel_slope_layer', 'kernel_slope_all', 'values_slope_all': least-squares slopes of
      log(error) against log(eta) of the three first-order lists (1 for first order).
    (c) observations: how much of the free-score law the parameterization lets through
    - 'supervised_rows_share': the share of query rows (b, i) with g != 0 (the rows the loss
      reads; :func:`supervised_rows`).
    - 'cos_kernel_g': cosine between J_l J_l^T g (the layer's W_Q, W_K step direction, not
      centred) and g over the entries of the supervised rows.
    - 'cos_kernel_g_centred': the same with J_l J_l^T g row-centred. The rows of g sum to zero,
      so centring only removes a part orthogonal to g: this is >= 'cos_kernel_g', and the
      ceiling below does not bound it.
    - 'ceiling_layer0': layer 0 only (None elsewhere): |P g| / |g| over the same entries, P the
      projection onto functions of (token_i, i, token_j, j) (:func:`tuple_ceiling`). In the
      first block a score is a function of that tuple (token embedding plus an absolute
      learned position, or none, through a LayerNorm and the query and key maps), and so is
      any change of it made by parameters: 'cos_kernel_g' cannot exceed this.
    - 'cos_kernel_all_g': cosine between J_all dL/dtheta_all (all parameters) and g over the
      supervised rows (no ceiling).
    - 'cos_kernel_G_values': cosine between X X^T G (the W_V step direction) and G over all
      value rows (no ceiling).
    """
    lrs = _check_kernel_probe(model, task, tokens, targets, lrs)
    twin = copy.deepcopy(model).double().eval()
    for p in twin.parameters():
        p.requires_grad_(True)
    named = dict(twin.named_parameters())
    names = list(named)
    params = [named[n] for n in names]
    n_layers, H = len(twin.blocks), twin.cfg.n_heads

    loss, traces, xs = _probe_forward(twin, task, tokens, targets)
    scores = [tr.attention.scores for tr in traces]
    values = [tr.v for tr in traces]
    outs = [tr.attention.output for tr in traces]
    grads = torch.autograd.grad(loss, params + scores + values + outs, retain_graph=True)
    grad_theta, g_s, g_v, u = _split_gradients(grads, names, n_layers)
    alpha = [tr.attention.weights.detach() for tr in traces]
    s0 = [s.detach() for s in scores]
    v0 = [v.detach() for v in values]
    visible = [torch.isfinite(s) for s in s0]

    qk_names = [[f"blocks.{l}.{m}.{w}" for m in ("q", "k") for w in ("weight", "bias")] for l in range(n_layers)]
    k_all_s, k_all_v, k_layer = _kernel_steps(twin, scores, values, grad_theta, qk_names)
    xa, g_v_flat, k_wv = _wv_steps(xs, g_v, H)
    all_steps, layer_steps, wv_steps = _realized_steps(twin, tokens, grad_theta, qk_names, lrs)
    out = []
    for l in range(n_layers):
        a, g, G, uu, v = alpha[l], g_s[l], g_v[l], u[l], v0[l]
        r1_err, r1_bound, r2_err, r2_bound = _insitu_errors(a, g, G, uu, v)

        e_layer = _errors(layer_steps[l], k_layer[l], lrs, visible[l])  # (H, n_eta)
        e_all = _errors([c[l] for c in all_steps], k_all_s[l], lrs, visible[l])
        e_wv = _errors(wv_steps[l], k_wv[l], lrs)
        e_v_all = _errors([c[n_layers + l] for c in all_steps], k_all_v[l], lrs)
        wv_bound = _wv_rounding_bound(twin.blocks[l].v, xa[l], g_v_flat[l], k_wv[l], lrs, H)

        rows = supervised_rows(g)
        cos_l = kernel_cosine(k_layer[l], g, rows)
        cos_lc = kernel_cosine(centre_rows(k_layer[l], visible[l]), g, rows)
        cos_all = kernel_cosine(k_all_s[l], g, rows)
        cos_v = kernel_cosine(k_wv[l], G)
        ceiling = tuple_ceiling(g, tokens, rows) if l == 0 else None
        share = rows.transpose(0, 1).reshape(H, -1).double().mean(1)
        for h in range(H):
            out.append({
                "layer": l, "head": h, "lrs": list(lrs), "loss": float(loss.detach()),
                "r1_insitu_rel_error": float(r1_err[h]), "r1_insitu_rounding_bound": float(r1_bound[h]),
                "r2_insitu_rel_error": float(r2_err[h]), "r2_insitu_rounding_bound": float(r2_bound[h]),
                "kernel_rel_error_layer": e_layer[h].tolist(), "kernel_rel_error_all": e_all[h].tolist(),
                "values_rel_error_wv": e_wv[h].tolist(), "values_rounding_bound_wv": wv_bound[h].tolist(),
                "values_rel_error_all": e_v_all[h].tolist(),
                "kernel_slope_layer": loglog_slope(lrs, e_layer[h].tolist()),
                "kernel_slope_all": loglog_slope(lrs, e_all[h].tolist()),
                "values_slope_all": loglog_slope(lrs, e_v_all[h].tolist()),
                "supervised_rows_share": float(share[h]),
                "cos_kernel_g": float(cos_l[h]), "cos_kernel_g_centred": float(cos_lc[h]),
                "ceiling_layer0": None if ceiling is None else float(ceiling[h]),
                "cos_kernel_all_g": float(cos_all[h]), "cos_kernel_G_values": float(cos_v[h]),
            })
    return out
