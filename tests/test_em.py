"""Attention as EM (R6): the head's attention is the E-step, and EM raises the likelihood."""
from __future__ import annotations


import torch

from attention_dynamics.em import em_step, gmm_log_likelihood, gmm_responsibilities, head_e_step, sample_gmm


F64 = torch.float64


def test_head_attention_is_the_e_step_and_em_increases_likelihood():
    means = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]], dtype=F64)
    x, _ = sample_gmm(50, means, 1.0, seed=0)
    start = means + 0.7
    torch.testing.assert_close(head_e_step(x, start, 1.0), gmm_responsibilities(x, start, 1.0), rtol=1e-5, atol=1e-14)
    ll = [gmm_log_likelihood(x, start, 1.0)]
    mu = start
    for _ in range(20):
        mu = em_step(x, mu, 1.0)
        ll.append(gmm_log_likelihood(x, mu, 1.0))
    assert all(b >= a - 1e-12 for a, b in zip(ll, ll[1:]))  # EM never lowers the likelihood
    # independent check of the responsibilities
    d2 = ((x[:, None] - start[None]) ** 2).sum(-1)
    r = torch.softmax(-d2 / 2, 1)
    torch.testing.assert_close(gmm_responsibilities(x, start, 1.0), r, rtol=1e-5, atol=1e-14)
