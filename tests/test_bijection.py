"""The bijection wind tunnel's task: its exact posterior and entropies against brute-force
enumeration of the bijections consistent with a prefix, and its samples."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from attention_dynamics.tasks.bijection import (WindTunnel, bayes_entropy_bits, posterior, posterior_entropy_bits,
                                                sample_batch,
                                                supervised_positions)


def brute_force_posterior(tokens, V, L):
    """Enumerate every bijection consistent with the prefix; the predictive distribution of
    the next value (and of the answer) is the share of consistent bijections giving each."""
    out = []
    perms = list(itertools.permutations(range(V)))
    for i in range(L + 1):
        if i < L:
            seen = [(tokens[2 * j], tokens[2 * j + 1]) for j in range(i)]
            key = tokens[2 * i]
        else:
            seen = [(tokens[2 * j], tokens[2 * j + 1]) for j in range(L)]
            key = tokens[2 * L]
        counts = np.zeros(V)
        for pi in perms:
            if all(pi[k] == v for k, v in seen):
                counts[pi[key]] += 1
        out.append(counts / counts.sum())
    return np.array(out)


@pytest.mark.parametrize("V,L", [(3, 2), (4, 3), (4, 4), (5, 3)])
def test_posterior_and_entropies_match_enumeration(V, L):
    task = WindTunnel(V, L)
    tokens, targets = sample_batch(task, 6, torch.Generator().manual_seed(V * 10 + L))
    post = posterior(tokens, task)
    for b in range(len(tokens)):
        ref = brute_force_posterior(tokens[b].tolist(), V, L)
        np.testing.assert_allclose(post[b].numpy(), ref, rtol=1e-5, atol=1e-12)
        ent = [-(p[p > 0] * np.log2(p[p > 0])).sum() for p in ref]
        np.testing.assert_allclose(bayes_entropy_bits(task).numpy(), ent, rtol=1e-5, atol=1e-12)
        assert post[b, np.arange(L + 1), targets[b]].min() > 0  # every target is possible


@pytest.mark.parametrize("V,L", [(3, 3), (4, 5), (5, 4)])
def test_posterior_with_repeated_keys_matches_enumeration(V, L):
    """The control variant: keys drawn with replacement; a repeated key's value is certain,
    and the posterior entropy at a position varies from sample to sample."""
    task = WindTunnel(V, L, repeats=True)
    tokens, targets = sample_batch(task, 40, torch.Generator().manual_seed(V * 10 + L))
    post = posterior(tokens, task)
    bits = posterior_entropy_bits(post)
    for b in range(8):
        ref = brute_force_posterior(tokens[b].tolist(), V, L)
        np.testing.assert_allclose(post[b].numpy(), ref, rtol=1e-5, atol=1e-12)
    assert post[torch.arange(40)[:, None], torch.arange(L + 1), targets].min() > 0
    keys = tokens[:, 0:2 * L:2]
    assert any(len(set(r.tolist())) < L for r in keys)  # some keys do repeat
    assert float(bits[:, 1:L].std(0).max()) > 0  # entropy is not a function of position alone
    with pytest.raises(ValueError, match="depends on the sample"):
        bayes_entropy_bits(task)


def test_samples_are_valid_bijection_sequences():
    task = WindTunnel(6, 4)
    tokens, targets = sample_batch(task, 200, torch.Generator().manual_seed(0))
    keys, vals = tokens[:, 0:8:2], tokens[:, 1:8:2]
    assert all(len(set(r.tolist())) == 4 for r in keys) and all(len(set(r.tolist())) == 4 for r in vals)
    q = tokens[:, 8]
    assert bool((keys == q[:, None]).any(1).all())
    assert torch.equal(targets[:, :4], vals)
    assert torch.equal(targets[:, 4], vals[keys == q[:, None]])
    assert supervised_positions(task).tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match=r"L must be an integer in \[1, 6\]"):
        WindTunnel(6, 7)
