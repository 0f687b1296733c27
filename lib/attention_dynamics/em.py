"""Attention as EM (R6): a Gaussian mixture, its textbook EM, and the head that mirrors it.

The mixture has K components with means mu_j, a shared isotropic variance sigma^2 and
weights pi_j. Its log-likelihood scores

    s_ij = log pi_j - ||x_i - mu_j||^2 / (2 sigma^2) - (d/2) log(2 pi sigma^2)

are a dot-product attention in disguise: ||x_i||^2 is the same for every j and cancels in
the softmax, so with augmented queries q_i = [x_i / sigma, 1] and keys
k_j = [mu_j / sigma, log pi_j - ||mu_j||^2 / (2 sigma^2)] at scale 1, softmax(q . k) is
exactly the EM responsibilities (the E-step). Chapter *Attention as a two-timescale EM
algorithm*: :func:`run_side_by_side` iterates textbook EM and the head to their fixed
points, :func:`value_step_paths` compares the closed-form M-step with gradient descent on the
values, :func:`rate_ratio_sweep` trains a cross-entropy head at several value/routing ratios.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .validation import check_float, check_int, check_tensor
from .head import attend

__all__ = [
    "gmm_scores",
    "gmm_log_likelihood",
    "gmm_responsibilities",
    "em_step",
    "gmm_queries_keys",
    "head_e_step",
    "head_value_step",
    "squared_error_value_gradient",
    "sample_gmm",
    "circle_mixture",
    "run_side_by_side",
    "value_step_paths",
    "rate_ratio_sweep",
]


def _check(x, means, sigma):
    check_tensor("x", x, ndim=2, nonempty=True)
    check_tensor("means", means, ndim=2, nonempty=True)
    if x.shape[1] != means.shape[1]:
        raise ValueError(f"x has dimension {x.shape[1]} but means have {means.shape[1]}")
    return check_float("sigma", sigma, 0.0, None, low_open=True)


def gmm_scores(x: Tensor, means: Tensor, sigma: float, log_pi: Tensor | None = None) -> Tensor:
    """(N, K) log pi_j + log N(x_i; mu_j, sigma^2 I)."""
    sigma = _check(x, means, sigma)
    K, d = means.shape
    log_pi = torch.full((K,), -math.log(K), dtype=x.dtype) if log_pi is None else log_pi
    sq = ((x[:, None, :] - means[None, :, :]) ** 2).sum(-1)
    return log_pi[None, :] - sq / (2 * sigma**2) - 0.5 * d * math.log(2 * math.pi * sigma**2)


def gmm_log_likelihood(x: Tensor, means: Tensor, sigma: float, log_pi: Tensor | None = None) -> float:
    """Mean log-likelihood per point, in nats."""
    return float(torch.logsumexp(gmm_scores(x, means, sigma, log_pi), 1).mean())


def gmm_responsibilities(x: Tensor, means: Tensor, sigma: float, log_pi: Tensor | None = None) -> Tensor:
    """The textbook E-step."""
    return torch.softmax(gmm_scores(x, means, sigma, log_pi), 1)


def em_step(x: Tensor, means: Tensor, sigma: float, *, hard: bool = False) -> Tensor:
    """One textbook EM iteration for the means (sigma and equal weights held fixed):
    mu_j <- sum_i r_ij x_i / sum_i r_ij. ``hard``: responsibilities replaced by the
    one-hot argmax (classification EM). A component nobody claims keeps its mean."""
    r = gmm_responsibilities(x, means, sigma)
    if hard:
        r = torch.nn.functional.one_hot(r.argmax(1), means.shape[0]).to(x.dtype)
    N = r.sum(0)
    new = (r.T @ x) / N.clamp_min(1e-300)[:, None]
    return torch.where(N[:, None] > 0, new, means)


def gmm_queries_keys(x: Tensor, means: Tensor, sigma: float) -> tuple[Tensor, Tensor]:
    """Augmented queries and keys whose dot product (scale 1) is the log-likelihood
    score up to a per-query constant; equal mixture weights (chapter *Attention as a
    two-timescale EM algorithm*)."""
    sigma = _check(x, means, sigma)
    ones = torch.ones(x.shape[0], 1, dtype=x.dtype)
    q = torch.cat([x / sigma, ones], 1)
    k = torch.cat([means / sigma, -(means**2).sum(1, keepdim=True) / (2 * sigma**2)], 1)
    return q, k


def head_e_step(x: Tensor, keys: Tensor, sigma: float, *, hard: bool = False) -> Tensor:
    """The head's attention weights over K slots whose keys sit at ``keys``."""
    q, k = gmm_queries_keys(x, keys, sigma)
    alpha = attend(q[None], k[None], k[None, :, :1], scale=1.0).weights[0]
    if hard:
        alpha = torch.nn.functional.one_hot(alpha.argmax(1), keys.shape[0]).to(x.dtype)
    return alpha


def squared_error_value_gradient(alpha: Tensor, values: Tensor, targets: Tensor) -> tuple[float, Tensor]:
    """Loss sum_i 1/2 ||g_i - t_i||^2 of the head output g = alpha V, and R2's value
    gradient sum_i alpha_ij (g_i - t_i) with the attention held fixed."""
    check_tensor("alpha", alpha, ndim=2, nonempty=True)
    check_tensor("values", values, ndim=2, nonempty=True)
    check_tensor("targets", targets, ndim=2)
    if alpha.shape[1] != values.shape[0]:
        raise ValueError(f"alpha has {alpha.shape[1]} columns (components) but values has {values.shape[0]} rows")
    if targets.shape != (alpha.shape[0], values.shape[1]):
        raise ValueError(f"targets must have shape (N, d) = {(alpha.shape[0], values.shape[1])}, got {tuple(targets.shape)}")
    g = alpha @ values
    u = g - targets
    return float(0.5 * (u**2).sum()), alpha.T @ u


def head_value_step(alpha: Tensor, values: Tensor, targets: Tensor, *, lr: float | None = None) -> Tensor:
    """One value update of the head with squared-error read-out. ``lr=None``: the
    prototype M-step, step 1/N_j per value (N_j = sum_i alpha_ij); otherwise plain
    gradient descent at rate ``lr``. A value nobody attends to stays put."""
    _, grad = squared_error_value_gradient(alpha, values, targets)
    if lr is None:
        N = alpha.sum(0)
        step = torch.where(N > 1e-12, 1.0 / N.clamp_min(1e-12), 0.0)[:, None]
    else:
        step = check_float("lr", lr, 0.0, None, low_open=True)
    return values - step * grad


def sample_gmm(n_per: int, means: Tensor, sigma: float, seed: int) -> tuple[Tensor, Tensor]:
    """n_per points from each component; returns (x, component)."""
    check_int("n_per", n_per, 1, None)
    sigma = check_float("sigma", sigma, 0.0, None, low_open=True)
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    K, d = means.shape
    comp = torch.arange(K).repeat_interleave(n_per)
    return means[comp] + sigma * torch.randn(K * n_per, d, generator=g, dtype=means.dtype), comp


def circle_mixture(n_components: int, separation: float, sigma: float, n_per: int, seed: int):
    """A mixture whose ``n_components`` means sit evenly on a circle of radius
    separation * sigma in the plane; ``n_per`` points each; and a start near the true
    means (so that EM and the head begin in the same basin). Returns (true means, x,
    component of each point, start)."""
    check_int("n_components", n_components, 2, 64)
    separation = check_float("separation", separation, 0.0, None, low_open=True)
    ang = torch.arange(n_components, dtype=torch.float64) * 2 * math.pi / n_components
    true = separation * sigma * torch.stack([ang.cos(), ang.sin()], 1)
    x, comp = sample_gmm(n_per, true, sigma, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    start = true + 0.5 * sigma * torch.randn(n_components, 2, generator=g, dtype=torch.float64)
    return true, x, comp, start


def run_side_by_side(x: Tensor, start: Tensor, sigma: float, n_iter: int) -> dict:
    """From one start, ``n_iter`` iterations each of textbook EM for the means and of the
    head (attention from the current values, then R2's 1/N_j value step on the
    squared-error read-out), soft and hard. Returns both paths (soft), the soft fixed points,
    the largest gap between hard EM and the hard head along the way, and the residuals
    (one more iteration's move) at the end."""
    n_iter = check_int("n_iter", n_iter, 1, None)
    mu, v, mu_h, v_h = (start.clone() for _ in range(4))
    path_mu, path_v, hard_gap = [mu], [v], 0.0
    for _ in range(n_iter):
        mu = em_step(x, mu, sigma)
        v = head_value_step(head_e_step(x, v, sigma), v, x)
        mu_h = em_step(x, mu_h, sigma, hard=True)
        v_h = head_value_step(head_e_step(x, v_h, sigma, hard=True), v_h, x)
        hard_gap = max(hard_gap, float((mu_h - v_h).abs().max()))
        path_mu.append(mu)
        path_v.append(v)
    return {"path_em": torch.stack(path_mu), "path_head": torch.stack(path_v), "em": mu, "head": v,
            "hard_max_gap": hard_gap,
            "em_residual": float((em_step(x, mu, sigma) - mu).abs().max()),
            "head_residual": float((head_value_step(head_e_step(x, v, sigma), v, x) - v).abs().max())}


def value_step_paths(x: Tensor, start: Tensor, sigma: float, n_iter: int, lr: float | None) -> tuple[Tensor, np.ndarray]:
    """The head's values over ``n_iter`` iterations, attention recomputed from the values
    each time, with the closed-form M-step (``lr=None``) or gradient descent at rate ``lr``
    on the squared-error read-out. Stops early once the values leave the finite range
    (|v| > 1e6). Returns the path (n + 1, K, d) and the loss per point before each step."""
    v, path, losses = start.clone(), [start.clone()], []
    for _ in range(check_int("n_iter", n_iter, 1, None)):
        a = head_e_step(x, v, sigma)
        loss, _ = squared_error_value_gradient(a, v, x)
        losses.append(loss / len(x))
        v = head_value_step(a, v, x, lr=lr)
        path.append(v.clone())
        if not torch.isfinite(v).all() or v.abs().max() > 1e6:
            break
    return torch.stack(path), np.array(losses)


def rate_ratio_sweep(task, ratios, n_seeds: int, *, routing_lr: float, n_steps: int, threshold: float,
                     seed: int = 0, d_k: int = 4, d_v: int = 4, init_std: float = 0.5) -> tuple[list[dict], dict]:
    """The cross-entropy head on the cluster task, trained with the EM-style schedule
    (:func:`attention_dynamics.training.em_style_rates`): routing and read-out at ``routing_lr``, the
    values at ratio x that, for every ratio and ``n_seeds`` initial weights. A run whose loss
    stops being finite or exceeds 20 nats is stopped and marked diverged. Returns one row per
    run (steps to reach ``threshold``, final and peak loss, divergence) and the loss curves
    of the runs that finished, by (ratio, seed)."""
    from .head import init_memory_head
    from .laws import head_loss_fn
    from .stats import first_step_below
    from .training import SGD, TrainingDiverged, em_style_rates, head_rates, train

    loss_fn = head_loss_fn(task.x[None], task.cluster[None], memory=task.memory[None])
    rows, curves = [], {}
    for ratio in ratios:
        for s in range(check_int("n_seeds", n_seeds, 1, None)):
            p = init_memory_head(task.x.shape[1], task.n_slots, task.n_clusters, d_k, d_v, std=init_std, seed=seed + s)
            rule = SGD(head_rates(em_style_rates(routing_lr, routing_lr * ratio)))
            try:
                L = train(p, loss_fn, rule, n_steps, max_loss=20.0).loss
            except TrainingDiverged as e:
                rows.append(dict(ratio=ratio, seed=s, diverged=True, diverged_at=e.step, steps_to_threshold=None,
                                 final_loss=float("nan"), peak_loss=float("nan")))
                continue
            rows.append(dict(ratio=ratio, seed=s, diverged=False, diverged_at=None,
                             steps_to_threshold=first_step_below(L, threshold), final_loss=float(L[-1]),
                             peak_loss=float(L.max())))
            curves[(ratio, s)] = L
    return rows, curves

