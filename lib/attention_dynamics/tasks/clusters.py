"""Queries from a few clusters, each cluster needing its own output (the R5 chapter).

A single head reads a memory of M one-hot slots: slot j's key is row j of W_K and its
value is row j of W_V, so keys and values are free vectors and "value j" is literally a
point that moves. Query i comes from cluster c(i) and must be classified as c(i). The
solution is known: each cluster routes to its own slot, and that slot's value is read out
as the cluster's class.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import check_float, check_int
from ..head import HeadParams
from ..laws import loss_and_gradients
from ..training import StepOutput

__all__ = ["ClusterTask", "make_cluster_task", "init_cluster_head", "cluster_loss_fn"]


@dataclass(frozen=True)
class ClusterTask:
    x: Tensor  # (N, d_x) queries
    cluster: Tensor  # (N,) cluster of each query, also its target class
    centers: Tensor  # (K, d_x)
    memory: Tensor  # (M, M) one-hot slot inputs
    n_clusters: int

    @property
    def n_slots(self) -> int:
        return self.memory.shape[0]


def make_cluster_task(n_clusters: int = 3, per_cluster: int = 30, d_x: int = 6, *, n_slots: int | None = None,
                      spread: float = 0.3, seed: int = 0, dtype=torch.float64) -> ClusterTask:
    K = check_int("n_clusters", n_clusters, 2, 64)
    n = check_int("per_cluster", per_cluster, 1, 100_000)
    d_x = check_int("d_x", d_x, 1, 4096)
    M = K if n_slots is None else check_int("n_slots", n_slots, 1, 4096)
    spread = check_float("spread", spread, 0.0, None)
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    centers = torch.randn(K, d_x, generator=g, dtype=dtype)
    centers = centers / centers.norm(dim=1, keepdim=True)  # unit-norm cluster directions
    cluster = torch.arange(K).repeat_interleave(n)
    x = centers[cluster] + spread * torch.randn(K * n, d_x, generator=g, dtype=dtype)
    return ClusterTask(x=x, cluster=cluster, centers=centers, memory=torch.eye(M, dtype=dtype), n_clusters=K)


def init_cluster_head(task: ClusterTask, d_k: int = 4, d_v: int = 4, *, std: float = 0.1, seed: int = 0,
                      symmetric: float | None = None) -> dict[str, Tensor]:
    """Parameters as a dict for the training loop. ``symmetric=eps``: every slot starts
    from the same key and value plus a perturbation of relative size eps, the nearly
    symmetric start of the symmetry-breaking experiment."""
    d_k = check_int("d_k", d_k, 1, 4096)
    d_v = check_int("d_v", d_v, 1, 4096)
    std = check_float("std", std, 0.0, None, low_open=True)
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    dt, M, d_x, K = task.x.dtype, task.n_slots, task.x.shape[1], task.n_clusters

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=dt) * std

    W_Q, W_K, W_V, W_O = draw(1, d_x, d_k), draw(1, M, d_k), draw(1, M, d_v), draw(d_v, K)
    if symmetric is not None:
        eps = check_float("symmetric", symmetric, 0.0, None)
        W_K = W_K[:, :1].expand(1, M, d_k) + eps * draw(1, M, d_k)
        W_V = W_V[:, :1].expand(1, M, d_v) + eps * draw(1, M, d_v)
    HeadParams(W_Q, W_K, W_V, W_O)  # validates the shapes
    return {"W_Q": W_Q.clone(), "W_K": W_K.clone(), "W_V": W_V.clone(), "W_O": W_O.clone()}


def cluster_loss_fn(task: ClusterTask):
    """Closed-form loss and gradients (R1-R3) of the head on the task; ``info`` carries
    the attention (N, M), the compatibilities and advantages' ingredients, and the
    responsibilities N_j shaped like W_V's rows (for the prototype M-step)."""
    x, y, mem = task.x[None], task.cluster[None], task.memory[None]

    def loss_fn(p: dict[str, Tensor]) -> StepOutput:
        loss, grads, state, ro, ag = loss_and_gradients(HeadParams(**p), x, y, memory=mem)
        alpha = state.attention.weights[0, 0]
        info = {"alpha": alpha, "b": ag.compatibility[0, 0], "u": ro.u[0], "scores": state.attention.scores[0, 0],
                "grad_scores": ag.scores[0, 0],
                "responsibility": alpha.sum(0)[None], "values": state.v[0, 0], "log_probs": ro.log_probs[0]}
        return StepOutput(loss, grads, info)

    return loss_fn
