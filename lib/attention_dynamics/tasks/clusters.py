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

from ..validation import check_float, check_int

__all__ = ["ClusterTask", "make_cluster_task"]


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
