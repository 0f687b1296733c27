"""Measures of routing and content specializing together (R5)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import check_int, check_tensor
from .laws import advantage

__all__ = ["cluster_usage", "value_cluster_shares", "specialization_index", "advantage_sign_agreement"]


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
    adv = advantage(alpha_t, b_t)
    keep = (alpha_t > 0) & (adv.abs() > rel_tol * adv.abs().max()) & (change.abs() > rel_tol * change.abs().max())
    if not bool(keep.any()):
        return float("nan"), float("nan"), 0
    agree = (torch.sign(change) == -torch.sign(adv))[keep].to(alpha_t.dtype)
    w = (alpha_t * adv.abs())[keep]
    return float(agree.mean()), float((agree * w).sum() / w.sum()), int(keep.sum())
