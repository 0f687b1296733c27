"""Baselines tuned alike (attention_dynamics.tuning and the Adam rule): Adam against
torch.optim.Adam in float64, batched runs; trials, choices and levels on small protocols;
and the tuned comparison's controls: a crippled baseline must come out behind, a method
against itself the same."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_dynamics.claims import FAILS, HOLDS, PARTLY, SAME, paired_advantage, same_margin
from attention_dynamics.training import StepOutput
from attention_dynamics.tuning import (METHODS, Adam, Trial, choose, mean_steps_below, method_rates, run_cluster_trial,
                                       run_trial, step_seconds, steps_below, steps_to_reach, tune)

SMALL = dict(ratio=10.0, n_steps=40, seq_len=300, eval_every=10)


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 7), (4, 1, 1, 3)])
def test_adam_matches_torch_adam_run_by_run(shape):
    """R runs stacked, each with its own rate, step as R separate torch.optim.Adam would.
    Both compute the same float64 expressions in a slightly different order (lr / bias1 * m
    / denom against addcdiv with -lr / bias1): per step a few ulps of the update, so over
    60 steps the parameters (of order 1) agree to well under 1e-12."""
    torch.manual_seed(0)
    R = shape[0]
    start = {"a": torch.randn(*shape, dtype=torch.float64), "b": torch.randn(R, 6, dtype=torch.float64)}
    lrs = torch.logspace(-3, -1, R, dtype=torch.float64)
    mine = {k: v.clone() for k, v in start.items()}
    rule = Adam({"a": lrs, "b": lrs}, betas=(0.8, 0.99), eps=1e-6)
    refs = [{k: v[r].clone().requires_grad_(True) for k, v in start.items()} for r in range(R)]
    opts = [torch.optim.Adam(list(refs[r].values()), lr=float(lrs[r]), betas=(0.8, 0.99), eps=1e-6)
            for r in range(R)]
    grad = lambda p: torch.sin(3 * p) + p ** 2  # noqa: E731 (a gradient field that changes with p)
    for step in range(60):
        rule(mine, StepOutput(torch.zeros(R), {k: grad(v) for k, v in mine.items()}), step)
        for r in range(R):
            for p in refs[r].values():
                p.grad = grad(p.detach())
            opts[r].step()
    for k in mine:
        for r in range(R):
            torch.testing.assert_close(mine[k][r], refs[r][k].detach(), rtol=0, atol=1e-12)


def test_adam_and_method_arguments_are_checked():
    with pytest.raises(ValueError, match="lr"):
        Adam(-1.0)
    with pytest.raises(ValueError, match="betas\\[1\\]"):
        Adam(0.1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="method must be one of"):
        method_rates("RMSprop", 0.1, 10.0)
    with pytest.raises(ValueError, match="ratio"):
        method_rates("EM-style", 0.1, 0.0)
    with pytest.raises(ValueError, match="grid must be increasing"):
        tune("SGD", [0.1, 0.01], [1], **SMALL)


def test_each_method_makes_its_own_group_fast():
    assert method_rates("SGD", 0.1, 10.0) == {"routing": 0.1, "values": 0.1, "other": 0.1}
    assert method_rates("Adam", 0.1, 10.0) == {"routing": 0.1, "values": 0.1, "other": 0.1}
    assert method_rates("EM-style", 0.1, 10.0) == {"routing": 0.1, "values": 1.0, "other": 0.1}
    assert method_rates("fast routing", 0.1, 10.0) == {"routing": 1.0, "values": 0.1, "other": 0.1}
    assert method_rates("fast W_O", 0.1, 10.0) == {"routing": 0.1, "values": 0.1, "other": 1.0}
    assert set(METHODS) == {"SGD", "Adam", "EM-style", "fast routing", "fast W_O"}


def test_a_trial_is_deterministic_and_tracks_the_held_out_loss():
    from attention_dynamics.causal_head import causal_head_loss_fn, init_heads
    from attention_dynamics.tasks.sticky_chain import sample_sequences
    from attention_dynamics.tuning import HELD_OUT

    a = run_trial("EM-style", 0.02, [3, 4], **SMALL)
    b = run_trial("EM-style", 0.02, [3, 4], **SMALL)
    np.testing.assert_array_equal(a.test_loss, b.test_loss)
    np.testing.assert_array_equal(a.train_loss, b.train_loss)
    assert list(a.eval_steps) == [0, 10, 20, 30, 40] and a.train_loss.shape == (41, 2)
    held = sample_sequences([3 + HELD_OUT, 4 + HELD_OUT], n_states_seq=SMALL["seq_len"])
    at_start = causal_head_loss_fn(held.x, held.y)(init_heads([3, 4])).loss.numpy()
    np.testing.assert_allclose(a.test_loss[0], at_start, rtol=0, atol=0)
    assert (a.train_loss[-1] < a.train_loss[0]).all()  # it trains (held out, a short sequence may not gain)


def test_a_diverged_trial_counts_as_infinitely_bad_and_is_never_chosen():
    bad = run_trial("SGD", 100.0, [3], **SMALL)
    assert bad.diverged_at is not None and np.isinf(bad.final_test).all() and bad.test_loss is None
    lr, bracketed = choose([run_trial("SGD", 0.01, [3], **SMALL), bad])
    assert lr == 0.01 and not bracketed
    with pytest.raises(ValueError, match="no trial of SGD has a finite score"):
        choose([bad, bad])


def test_choose_flags_a_best_rate_at_the_end_of_the_grid():
    def fake(lr, final):
        return Trial("SGD", lr, [0], None, np.array([0]), np.array([[final]]), None, 0.0)
    final = lambda t: float(np.mean(t.final_test))  # noqa: E731
    assert choose([fake(0.1, 2.0), fake(0.3, 2.1), fake(1.0, 2.2)], final) == (0.1, False)
    assert choose([fake(0.1, 2.1), fake(0.3, 2.0), fake(1.0, 2.2)], final) == (0.3, True)
    assert choose([fake(0.1, 2.2), fake(0.3, 2.1), fake(1.0, 2.0)], final) == (1.0, False)
    assert choose([fake(0.1, 2.0), fake(0.3, 2.0), fake(1.0, 2.2)], final) == (0.1, False)  # a tie: the smaller


def test_steps_to_reach_reads_the_first_evaluation_at_or_below_the_level():
    t = Trial("SGD", 0.1, [0, 1], None, np.array([0, 10, 20]), np.array([[2.1, 2.1], [2.0, 2.05], [1.9, 2.05]]),
              None, 0.0)
    np.testing.assert_array_equal(steps_to_reach(t, 2.0), [10.0, np.nan])
    np.testing.assert_array_equal(steps_to_reach(t, 2.05), [10.0, 10.0])


def test_the_tuned_comparison_can_say_ahead_and_same():
    """Positive control: EM-style against a baseline crippled by construction (SGD at a rate
    300x below EM-style's base, so it barely leaves its start) must come out ahead (by the
    margin or not: how far EM-style gets on this small protocol is not by construction).
    Negative controls: EM-style against its own runs, and against a near twin at its rate
    x 1.05, must come out the same."""
    seeds, setup = [5, 6, 7, 8], dict(ratio=10.0, n_steps=300, seq_len=600, eval_every=50)
    em = run_trial("EM-style", 0.03, seeds, **setup)
    crippled = run_trial("SGD", 1e-4, seeds, **setup)
    assert np.abs(crippled.final_test - crippled.test_loss[0]).max() < 2e-3  # it barely moved
    margin = same_margin(1.83)
    ahead = paired_advantage(crippled.test_auc - em.test_auc, margin)
    assert ahead.verdict in (HOLDS, PARTLY), ahead  # ahead; by how much depends on this small protocol
    ahead_final = paired_advantage(crippled.final_test - em.final_test, margin)
    assert ahead_final.verdict in (HOLDS, PARTLY), ahead_final
    itself = paired_advantage(em.test_auc - em.test_auc, margin)
    assert itself.verdict == FAILS and itself.why.startswith(SAME)
    twin = run_trial("EM-style", 0.03 * 1.05, seeds, **setup)  # a near twin: noise, and the same
    near = paired_advantage(twin.test_auc - em.test_auc, margin)
    assert near.verdict == FAILS and near.why.startswith(SAME), near
    assert margin == pytest.approx(0.1 * (math.log(8) - 1.83))


def test_the_score_is_the_area_under_the_held_out_curve():
    t = Trial("SGD", 0.1, [0, 1], None, np.array([0, 10, 20]), np.array([[2.0, 2.0], [1.0, 2.0], [1.0, 2.0]]),
              None, 0.0)
    np.testing.assert_allclose(t.test_auc, [1.25, 2.0])  # (1.5 * 10 + 1.0 * 10) / 20; flat 2.0
    gone = Trial("SGD", 9.0, [0, 1], None, np.array([]), None, 3, 0.0)
    assert np.isinf(gone.test_auc).all() and np.isinf(gone.final_test).all()
    # by default a choice reads the area: the fast trial wins though both end at 1.0
    slow = Trial("SGD", 0.3, [0], None, np.array([0, 10, 20]), np.array([[2.0], [2.0], [1.0]]), None, 0.0)
    fast = Trial("SGD", 0.1, [0], None, np.array([0, 10, 20]), np.array([[2.0], [1.0], [1.0]]), None, 0.0)
    assert choose([fast, slow])[0] == 0.1


def test_a_cluster_trial_keeps_the_seeds_that_did_not_diverge():
    from attention_dynamics.tasks.clusters import make_cluster_task

    task = make_cluster_task(3, 30, 6, spread=0.3, seed=0)
    t = run_cluster_trial("SGD", 1.0, [0, 1], task=task, ratio=10.0, n_steps=200)
    steps = steps_below(t, 0.2)
    assert t.diverged_at is None and t.train_loss.shape == (201, 2) and np.isfinite(steps).all()
    assert mean_steps_below(0.2)(t) == pytest.approx(steps.mean())
    assert mean_steps_below(1e-9)(t) == math.inf  # never reached on some seed: no finite score
    gone = run_cluster_trial("SGD", 1e4, [0, 1], task=task, ratio=10.0, n_steps=50)
    assert gone.diverged_at is not None and np.isinf(steps_below(gone, 0.2)).all()


def test_step_seconds_times_every_arm():
    times = step_seconds({"SGD": ("SGD", 0.01), "Adam": ("Adam", 0.01)}, [1, 2], ratio=10.0, seq_len=100,
                         steps=2, rounds=2)
    assert set(times) == {"SGD", "Adam"} and all(0 < x < 10 for x in times.values())
