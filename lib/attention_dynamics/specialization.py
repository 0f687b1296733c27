"""Measures of routing and content specializing together (R5; chapter *Routing and content
specialize together*): which value serves which cluster of queries, whether each value step
points along its users' error signals, and whether attention moves the way the routing law
says, along training and against the step size."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .agreement import sign_agreement
from .laws import advantage, attention_entropy
from .validation import check_float, check_int, check_tensor

__all__ = ["cluster_usage", "value_cluster_shares", "specialization_index", "advantage_sign_agreement", "movement_agreement",
           "pooled_movement_agreement", "whole_run_agreement",
           "error_prototypes", "prototype_alignment", "step_size_probe", "SpecializationObserver", "break_symmetry"]


def _check_clusters(alpha: Tensor, cluster: Tensor, n_clusters: int) -> None:
    check_tensor("alpha", alpha, ndim=2, nonempty=True)
    check_tensor("cluster", cluster, ndim=1, kind="int")
    check_int("n_clusters", n_clusters, 1, None)
    if cluster.shape[0] != alpha.shape[0]:
        raise ValueError(f"cluster must give one cluster per query ({alpha.shape[0]}), got {cluster.shape[0]}")
    if int(cluster.min()) < 0 or int(cluster.max()) >= n_clusters:
        raise ValueError(f"cluster must hold indices in [0, {n_clusters - 1}], got values in "
                         f"[{int(cluster.min())}, {int(cluster.max())}]")


def cluster_usage(alpha: Tensor, cluster: Tensor, n_clusters: int) -> Tensor:
    """(K, M): mean attention that the queries of cluster c pay to value j."""
    _check_clusters(alpha, cluster, n_clusters)
    onehot = torch.nn.functional.one_hot(cluster, n_clusters).to(alpha.dtype)  # (N, K)
    return (onehot.T @ alpha) / onehot.sum(0)[:, None]


def value_cluster_shares(alpha: Tensor, cluster: Tensor, n_clusters: int) -> tuple[Tensor, Tensor]:
    """Share U_jc of value j's total responsibility N_j that comes from cluster c, and N_j."""
    _check_clusters(alpha, cluster, n_clusters)
    onehot = torch.nn.functional.one_hot(cluster, n_clusters).to(alpha.dtype)
    per = alpha.T @ onehot  # (M, K)
    N = per.sum(1)
    return per / N.clamp_min(1e-300)[:, None], N


def specialization_index(alpha: Tensor, cluster: Tensor, n_clusters: int) -> float:
    """sum_j (N_j / N) (1 - H(U_j) / log K): 0 when every value serves all clusters
    equally, 1 when every value serves a single cluster."""
    U, N = value_cluster_shares(alpha, cluster, n_clusters)
    logU = torch.log(torch.where(U > 0, U, torch.ones((), dtype=U.dtype)))
    H = -(U * logU).sum(1)
    return float(((N / N.sum()) * (1 - H / math.log(n_clusters))).sum())


def advantage_sign_agreement(alpha_t: Tensor, b_t: Tensor, change: Tensor, *, rel_tol: float = 1e-9) -> tuple[float, float, int]:
    """How often a change (of alpha, or of centred scores) from step t to t+1 has the sign
    the routing law predicts, -sign(b - E_alpha[b]) at step t.

    Entries whose advantage or change is below ``rel_tol`` times the largest are left out
    (they have no sign to speak of). Returns (agreement rate, agreement weighted by
    alpha * |advantage|, number of entries compared)."""
    check_tensor("alpha_t", alpha_t, min_ndim=1, nonempty=True)
    for name, t in (("b_t", b_t), ("change", change)):
        check_tensor(name, t, min_ndim=1)
        if t.shape != alpha_t.shape:
            raise ValueError(f"{name} must have the shape of alpha_t {tuple(alpha_t.shape)}, got {tuple(t.shape)}")
    # weighted by the law's push on the entry: alpha * |advantage| is the size of R1's
    # closed-form change of alpha (agreement.py lists the weightings)
    adv = advantage(alpha_t, b_t)
    a = sign_agreement(change, -adv, where=alpha_t > 0, weights=alpha_t * adv.abs(), rel_tol=rel_tol)
    return a.rate, a.weighted, a.n


def movement_agreement(alpha_t: Tensor, b_t: Tensor, change: Tensor, *, rel_tol: float = 1e-9) -> tuple[float, float]:
    """The movement of alpha from step t to t+1 that has the sign the routing law predicts,
    -sign(b - E_alpha[b]) at step t, as (sum of |change| over the agreeing entries, sum of
    |change| over all entries compared), with the entries of :func:`advantage_sign_agreement`.
    Summed over a run, their ratio is the share of the attention's movement that follows the
    law: steps where attention barely moves (a plateau) count as little as they move."""
    # weighted by the movement, so that pooled over a run it is a share of the movement
    a = sign_agreement(change, -advantage(alpha_t, b_t), where=alpha_t > 0, weights=change.abs(), rel_tol=rel_tol)
    return a.agreeing_weight, a.total_weight


def error_prototypes(u: Tensor, cluster: Tensor, n_clusters: int) -> Tensor:
    """(K, d_v): each cluster's summed negative error signal -sum_{i in c} u_i, the direction
    R2 moves a value that cluster c uses."""
    return torch.stack([-u[cluster == c].sum(0) for c in range(n_clusters)])


def prototype_alignment(alpha: Tensor, u: Tensor, grad_v: Tensor, cluster: Tensor, n_clusters: int) -> float:
    """Cosine between each value's step -dL/dv_j and the error prototype of the cluster
    that uses it most, averaged with weights N_j (R2 seen cluster by cluster)."""
    shares, N = value_cluster_shares(alpha, cluster, n_clusters)
    proto = error_prototypes(u, cluster, n_clusters)
    cos = torch.nn.functional.cosine_similarity(-grad_v, proto[shares.argmax(1)], dim=1)
    return float((N * cos).sum() / N.sum())


def step_size_probe(loss_fn, params: dict[str, Tensor], out, etas) -> list[dict]:
    """From one state, one gradient step of each size in ``etas``: how often the change of
    alpha follows -sign(advantage), for the real step through W_Q and W_K and for the same
    step taken on free scores (where R1 holds for the scores by construction). ``loss_fn``
    is a :func:`attention_dynamics.laws.head_loss_fn` of one sequence and one head."""
    a0, b0 = out.info["alpha"][0, 0], out.info["b"][0, 0]
    scores, grad_scores = out.info["scores"][0, 0], out.info["grad_scores"][0, 0]
    rows = []
    for eta in etas:
        moved = {n: t - eta * out.grads[n] for n, t in params.items()}
        a1 = loss_fn(moved).info["alpha"][0, 0]
        rate, wrate, n = advantage_sign_agreement(a0, b0, a1 - a0)
        a1_free = torch.softmax(scores - eta * grad_scores, 1)
        frate, fwrate, _ = advantage_sign_agreement(a0, b0, a1_free - a0)
        rows.append(dict(eta=eta, agreement=rate, weighted=wrate, free_agreement=frate, free_weighted=fwrate, n=n))
    return rows


class SpecializationObserver:
    """The training callback of the specialization chapter. At every checkpoint: the mean
    attention entropy (nats), the specialization index, the prototype alignment of the
    value steps, and the sign agreement of the training step just taken (from the previous
    checkpoint, so call it at every step), plain and weighted, beside the same agreement of
    the step free scores would take from the same state with the same rate ``lr``
    (s - lr dL/ds: R1 exact, the most agreement an exact law reaches at that state and
    rate, the softmax coupling a row's entries); at ``probe_steps`` the step-size probe; at
    ``snapshot_steps`` the attention, the values and the error prototypes."""

    def __init__(self, loss_fn, cluster: Tensor, n_clusters: int, *, lr: float, probe_steps=(), probe_lrs=(),
                 snapshot_steps=()):
        self.loss_fn, self.cluster, self.K = loss_fn, cluster, n_clusters
        self.lr = check_float("lr", lr, 0.0, None, low_open=True)
        self.probe_steps, self.probe_lrs, self.snapshot_steps = set(probe_steps), list(probe_lrs), set(snapshot_steps)
        self._prev: tuple[Tensor, Tensor, Tensor] | None = None  # alpha, b and the free-score step's alpha

    def __call__(self, step: int, p: dict[str, Tensor], out) -> dict:
        a, b, u = out.info["alpha"][0, 0], out.info["b"][0, 0], out.info["u"][0, 0]
        r = {"entropy": float(attention_entropy(a).mean()), "si": specialization_index(a, self.cluster, self.K),
             "alignment": prototype_alignment(a, u, out.grads["W_V"][0], self.cluster, self.K)}
        if self._prev is not None:
            a_prev, b_prev, a_free = self._prev
            r["step_agreement"], r["step_weighted"], _ = advantage_sign_agreement(a_prev, b_prev, a - a_prev)
            r["free_step_agreement"], r["free_step_weighted"], _ = advantage_sign_agreement(a_prev, b_prev,
                                                                                           a_free - a_prev)
            r["step_moved_agree"], r["step_moved"] = movement_agreement(a_prev, b_prev, a - a_prev)
            r["free_moved_agree"], r["free_moved"] = movement_agreement(a_prev, b_prev, a_free - a_prev)
        scores, grad_scores = out.info["scores"][0, 0], out.info["grad_scores"][0, 0]
        self._prev = (a.clone(), b.clone(), torch.softmax(scores - self.lr * grad_scores, -1))
        if step in self.probe_steps:
            r["probe"] = step_size_probe(self.loss_fn, p, out, self.probe_lrs)
        if step in self.snapshot_steps:
            r.update(alpha=a.clone(), values=p["W_V"][0].clone(), prototypes=error_prototypes(u, self.cluster, self.K))
        return r


def pooled_movement_agreement(history) -> dict[str, float]:
    """The share of the attention's movement over a whole run that follows the routing law,
    for the head ('moved_agreement') and for free scores stepped from the same states
    ('free_moved_agreement'): :func:`movement_agreement` summed over the steps, then divided."""
    return {name: float(np.sum(history.series(f"{prefix}_moved_agree")[1])
                        / np.sum(history.series(f"{prefix}_moved")[1]))
            for name, prefix in (("moved_agreement", "step"), ("free_moved_agreement", "free"))}


def whole_run_agreement(task, params: dict[str, Tensor], lr: float, n_steps: int) -> dict[str, float]:
    """Train a head on the cluster task with plain gradient descent at rate ``lr`` for
    ``n_steps`` and return the sign agreement of every training step with the routing law
    (the change of alpha against -sign(advantage) at the state it left), averaged over the
    whole run, plain and weighted by alpha |advantage|, for the head and for free scores
    stepped from the same states at the same rate (:class:`SpecializationObserver`), and the
    share of the movement that follows the law, pooled over the run
    (:func:`pooled_movement_agreement`); and the
    mean attention entropy (nats) and the specialization index at the start and the end."""
    from .laws import head_loss_fn
    from .training import SGD, train

    check_float("lr", lr, 0.0, None, low_open=True)
    loss_fn = head_loss_fn(task.x[None], task.cluster[None], memory=task.memory[None])
    h = train(params, loss_fn, SGD(lr), n_steps,
              callback=SpecializationObserver(loss_fn, task.cluster, task.n_clusters, lr=lr))
    out = {key: float(np.nanmean(h.series(key)[1])) for key in
           ("step_agreement", "step_weighted", "free_step_agreement", "free_step_weighted")}
    out.update(pooled_movement_agreement(h))
    for key in ("entropy", "si"):
        series = h.series(key)[1]
        out[f"{key}_start"], out[f"{key}_end"] = float(series[0]), float(series[-1])
    return out


def break_symmetry(task, params: dict[str, Tensor], lr: float, n_steps: int, *, specialized_at: float,
                   every: int = 5, frozen: tuple[str, ...] = ()) -> dict:
    """Train a head from a (nearly) symmetric start on the cluster task with plain gradient
    descent and follow the spread of its values ||V - mean(V)|| and the specialization index.
    Returns the checkpoint steps, the spread and index along them, the first step with index
    >= ``specialized_at`` (None if never), the final index, which value each cluster ends up
    using most (``winners``), and the final loss. ``frozen``: parameters held at their start
    (``("W_Q", "W_K")``: the routing cannot learn, the control that says whether the
    routing-value loop is what breaks the symmetry)."""
    from .laws import head_loss_fn
    from .stats import first_true
    from .training import SGD, StepOutput, train

    unknown = sorted(set(frozen) - set(params))
    if unknown:
        raise ValueError(f"frozen names {unknown}, which are not parameters; parameters: {sorted(params)}")
    sgd = SGD(lr)

    def rule(p, out, step):
        sgd(p, StepOutput(out.loss, {n: g for n, g in out.grads.items() if n not in frozen}, out.info), step)

    K = task.n_clusters

    def watch(step, p, out):
        V, alpha = p["W_V"][0], out.info["alpha"][0, 0]
        return {"spread": float((V - V.mean(0)).norm()), "si": specialization_index(alpha, task.cluster, K),
                "usage": cluster_usage(alpha, task.cluster, K)}

    loss_fn = head_loss_fn(task.x[None], task.cluster[None], memory=task.memory[None])
    h = train(params, loss_fn, rule, n_steps, callback=watch, every=every)
    steps, spread = h.series("spread")
    si = np.array(h.series("si")[1])
    return {"steps": steps, "spread": np.array(spread), "si": si,
            "steps_to_specialize": first_true(si >= specialized_at, steps=steps), "final_si": float(si[-1]),
            "winners": h.last()["usage"].argmax(1).tolist(), "final_loss": float(h.loss[-1])}

