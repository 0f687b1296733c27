"""The specialization measures (R5) on cases with known answers, and the cluster task they read."""
from __future__ import annotations


import pytest
import torch

from attention_dynamics.head import init_memory_head
from attention_dynamics.specialization import (advantage_sign_agreement, cluster_usage, specialization_index,
                                               value_cluster_shares)
from attention_dynamics.tasks.clusters import make_cluster_task


F64 = torch.float64


def test_specialization_index_extremes():
    cluster = torch.tensor([0, 0, 1, 1])
    perfect = torch.tensor([[1.0, 0], [1, 0], [0, 1], [0, 1]], dtype=F64)
    uniform = torch.full((4, 2), 0.5, dtype=F64)
    assert specialization_index(perfect, cluster, 2) == pytest.approx(1.0)
    assert specialization_index(uniform, cluster, 2) == pytest.approx(0.0, abs=1e-15)
    usage = cluster_usage(perfect, cluster, 2)
    assert usage.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    shares, N = value_cluster_shares(uniform, cluster, 2)
    assert N.tolist() == [2.0, 2.0] and shares.tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_advantage_sign_agreement_counts():
    alpha = torch.tensor([[0.5, 0.25, 0.25]], dtype=F64)
    b = torch.tensor([[1.0, -1.0, 3.0]], dtype=F64)  # advantages [0, -2, 2]
    rate, wrate, n = advantage_sign_agreement(alpha, b, torch.tensor([[0.0, 0.1, -0.1]], dtype=F64))
    assert (rate, wrate, n) == (1.0, 1.0, 2)
    rate, wrate, n = advantage_sign_agreement(alpha, b, torch.tensor([[0.0, -0.1, -0.1]], dtype=F64))
    assert rate == 0.5 and n == 2


def test_cluster_task_and_symmetric_start():
    task = make_cluster_task(4, 6, 5, spread=0.0, seed=3)
    assert task.x.shape == (24, 5) and torch.allclose(task.x, task.centers[task.cluster])
    p = init_memory_head(5, task.n_slots, task.n_clusters, 3, 2, seed=0, symmetric=0.0)
    assert torch.all(p["W_V"][0] == p["W_V"][0, :1]) and torch.all(p["W_K"][0] == p["W_K"][0, :1])
    with pytest.raises(ValueError, match="n_clusters must be an integer in \\[2, 64\\]"):
        make_cluster_task(1)
