"""The three inference primitives of R9 (accumulation, transport, binding): their Bayes
predictors against brute force, and the tasks well formed."""
from __future__ import annotations

import math

import numpy as np
import pytest

from attention_dynamics.tasks.primitives import Accumulation, Binding, Transport, make_task


def test_accumulation_bayes_is_the_dirichlet_predictive_by_brute_force():
    """The posterior predictive against numerical integration over the bias (K = 2: a
    Beta prior), and samples whose frequencies match the prior predictive."""
    task = Accumulation(K=2, T=6, alpha=0.7)
    batch = task.sample(5, np.random.default_rng(1))
    logp = task.bayes_log_probs(batch)
    grid = np.linspace(1e-6, 1 - 1e-6, 200_001)
    prior = grid ** (task.alpha - 1) * (1 - grid) ** (task.alpha - 1)
    for s in range(5):
        for t in range(task.T):
            ones = int(batch.inputs[s, : t + 1].sum())
            post = prior * grid**ones * (1 - grid) ** (t + 1 - ones)
            p1 = np.trapezoid(post * grid, grid) / np.trapezoid(post, grid)
            assert abs(math.exp(float(logp[s, t, 1])) - p1) < 2e-4
    big = task.sample(20_000, np.random.default_rng(2))
    assert abs(float(big.inputs.double().mean()) - 0.5) < 0.02  # symmetric prior


def test_binding_bayes_is_exact_and_the_task_is_well_formed():
    task = Binding(K=6, V=4, L=3, Q=5)
    b = task.sample(50, np.random.default_rng(3))
    assert b.inputs.shape == (50, 11) and b.targets.shape == (50, 5) and b.positions.tolist() == list(range(6, 11))
    keys, values = b.inputs[:, 0:6:2], b.inputs[:, 1:6:2] - task.K
    assert all(len(set(k.tolist())) == 3 for k in keys) and int(keys.max()) < task.K
    for s in range(50):
        bound = dict(zip(keys[s].tolist(), values[s].tolist()))
        assert [bound[q] for q in b.inputs[s, 6:].tolist()] == b.targets[s].tolist()
    assert float(-task.bayes_log_probs(b).gather(-1, b.targets[..., None]).sum()) == 0.0


def test_transport_bayes_is_the_forward_filter_and_carries_a_belief():
    """The filter beats the best predictor from x_t alone by half a bit and more at the
    default stickiness and noise, by almost nothing on R7's own chain; the samples stay at
    the matrix's self-transition rate."""
    for stay, noise, gain in [(0.9, 3.0, 0.5), (0.3, 1.0, 0.0)]:
        task = Transport(T=32, stay=stay, noise=noise)
        b = task.sample(400, np.random.default_rng(4))
        filt = float(-task.bayes_log_probs(b).gather(-1, b.targets[..., None]).mean()) / math.log(2)
        x_only = float(-task.baseline_log_probs(b).gather(-1, b.targets[..., None]).mean()) / math.log(2)
        assert filt < x_only - gain and (gain or x_only - filt < 0.01)
        stay_rate = (b.targets[:, 1:] == b.targets[:, :-1]).double().mean()
        assert abs(float(stay_rate) - float(task.matrix()[0, 0])) < 0.01
    with pytest.raises(ValueError, match="the primitive must be one of"):
        make_task("memory")
