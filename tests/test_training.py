"""The training loop and its update rules: rates per run and role, divergence stopped with the
step and the cause, closed-form training against autograd, the prototype M-step."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from attention_dynamics.em import head_value_step, squared_error_value_gradient
from attention_dynamics.head import HeadParams, init_memory_head
from attention_dynamics.laws import head_loss_fn, loss_and_gradients
from attention_dynamics.tasks.clusters import make_cluster_task
from attention_dynamics.training import (SGD, PrototypeMStep, StepOutput, TorchOptimizer, TrainingDiverged, em_style_rates,
                                         head_rates, train)

F64 = torch.float64


def quadratic(target):
    def fn(p):
        d = p["w"] - target
        return StepOutput((0.5 * d**2).sum(-1), {"w": d.clone()})
    return fn


def test_sgd_on_a_quadratic_contracts_by_one_minus_lr():
    target = torch.tensor([1.0, -2.0], dtype=F64)
    p = {"w": torch.zeros(2, dtype=F64)}
    h = train(p, quadratic(target), SGD(0.25), 10)
    assert h.loss.shape == (11,)
    np.testing.assert_allclose(h.loss, h.loss[0] * 0.75 ** (2 * np.arange(11)), rtol=1e-12, atol=1e-8)


def test_per_run_rates_and_losses_for_batched_runs():
    target = torch.zeros(3, 2, dtype=F64)
    p = {"w": torch.ones(3, 2, dtype=F64)}
    h = train(p, quadratic(target), SGD({"w": torch.tensor([0.1, 0.5, 1.0], dtype=F64)}), 1)
    assert h.loss.shape == (2, 3)
    np.testing.assert_allclose(h.loss[1], [0.81, 0.25, 0.0], rtol=1e-5, atol=1e-8)


def test_divergence_stops_with_step_and_cause():
    target = torch.zeros(2, dtype=F64)
    with pytest.raises(TrainingDiverged, match=r"diverged at step \d+: the loss .* exceeded max_loss = 100") as e:
        train({"w": torch.ones(2, dtype=F64)}, quadratic(target), SGD(3.0), 50, max_loss=100.0)
    assert e.value.step > 0

    def nan_fn(p):
        return StepOutput(torch.tensor(float("nan")), {"w": p["w"]})
    with pytest.raises(TrainingDiverged, match="at step 0: the loss is nan"):
        train({"w": torch.ones(1)}, nan_fn, SGD(0.1), 3)

    def bad_grad(p):
        return StepOutput(torch.tensor(1.0), {"w": torch.tensor([float("inf")])})
    with pytest.raises(TrainingDiverged, match="gradient of w is not finite"):
        train({"w": torch.ones(1)}, bad_grad, SGD(0.1), 3)


def test_divergence_names_the_run():
    def fn(p):
        return StepOutput(torch.tensor([1.0, float("inf"), 2.0]), {})
    with pytest.raises(TrainingDiverged, match=r"\(run 1\)"):
        train({}, fn, SGD(0.1), 1)


def test_rules_validate_arguments():
    with pytest.raises(ValueError, match=r"lr must be a finite number in \(0, inf\)"):
        SGD(0.0)
    with pytest.raises(ValueError, match=r"lr\['W_V'\]"):
        SGD({"W_V": -1.0})
    with pytest.raises(KeyError, match="no learning rate for parameter 'W_O'"):
        SGD({"W_V": 0.1})({"W_O": torch.zeros(1)}, StepOutput(torch.tensor(0.0), {"W_O": torch.zeros(1)}), 0)
    with pytest.raises(ValueError, match=r"n_steps must be an integer >= 0"):
        train({}, quadratic(torch.zeros(1)), SGD(0.1), -1)


def test_em_style_rates_by_role():
    rates = em_style_rates(0.01, 0.1)
    assert rates == {"routing": 0.01, "values": 0.1, "other": 0.01}
    assert SGD(head_rates(rates)).lr == {"W_Q": 0.01, "W_K": 0.01, "W_O": 0.01, "W_V": 0.1}
    with pytest.raises(ValueError, match="must give a rate for every role"):
        head_rates({"values": 0.1})


def test_closed_form_training_matches_autograd_sgd():
    """The loop with closed-form gradients equals torch autograd + plain SGD step for step."""
    task = make_cluster_task(3, 5, 4, seed=1)
    p = init_memory_head(4, task.n_slots, task.n_clusters, 3, 3, std=0.5, seed=2)
    ref = {n: t.clone().requires_grad_(True) for n, t in p.items()}
    train(p, head_loss_fn(task.x[None], task.cluster[None], memory=task.memory[None]), SGD(0.5), 20)
    opt = torch.optim.SGD(ref.values(), lr=0.5)
    for _ in range(20):
        opt.zero_grad()
        loss, *_ = loss_and_gradients(HeadParams(**ref), task.x[None], task.cluster[None], memory=task.memory[None])
        loss.backward()
        opt.step()
    for n in p:
        torch.testing.assert_close(p[n], ref[n].detach(), rtol=1e-5, atol=1e-12)


def test_torch_optimizer_rule_with_clipping():
    w = torch.nn.Parameter(torch.tensor([10.0]))
    opt = torch.optim.SGD([w], lr=1.0)

    def fn(p):
        opt.zero_grad()
        loss = (p["w"] ** 2).sum()
        loss.backward()
        return StepOutput(loss.detach(), {"w": p["w"].grad})
    train({"w": w}, fn, TorchOptimizer(opt, clip_norm=1.0), 1)
    assert w.item() == pytest.approx(9.0)


def test_prototype_m_step_lands_on_weighted_mean_under_hard_attention():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, generator=g, dtype=F64)
    values = torch.randn(3, 2, generator=g, dtype=F64)
    alpha = torch.nn.functional.one_hot(torch.arange(12) % 3, 3).to(F64)
    _, grad = squared_error_value_gradient(alpha, values, x)
    p = {"W_V": values.clone()[None]}
    PrototypeMStep(0.1)(p, StepOutput(torch.tensor(0.0), {"W_V": grad[None]}, {"responsibility": alpha.sum(0)[None]}), 0)
    mean = torch.stack([x[torch.arange(12) % 3 == j].mean(0) for j in range(3)])
    torch.testing.assert_close(p["W_V"][0], mean, rtol=1e-5, atol=1e-14)
    torch.testing.assert_close(head_value_step(alpha, values, x), mean, rtol=1e-5, atol=1e-14)


def test_prototype_m_step_needs_responsibilities():
    with pytest.raises(KeyError, match="responsibility"):
        PrototypeMStep(0.1)({"W_V": torch.zeros(1, 2, 2)}, StepOutput(torch.tensor(0.0), {"W_V": torch.zeros(1, 2, 2)}), 0)
