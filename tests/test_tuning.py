"""Baselines tuned alike (attention_dynamics.tuning and the Adam rule): Adam against
torch.optim.Adam in float64, batched runs; trials, choices and levels on small protocols;
and the tuned comparison's controls: a crippled baseline must come out behind, a method
against itself the same."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_dynamics.rules import FAILS, HOLDS, SAME
from attention_dynamics.training import StepOutput
from attention_dynamics.tuning import (METHODS, Adam, Trial, as_record, choose, method_rates, reach_score,
                                       run_cluster_trial, run_trial, step_seconds, steps_below, steps_to_reach, tune)

SMALL = dict(ratio=10.0, n_steps=40, seq_len=300, eval_every=10, dense_until=0)


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
    dense = run_trial("EM-style", 0.02, [3, 4], **{**SMALL, "dense_until": 12})
    assert list(dense.eval_steps) == list(range(13)) + [20, 30, 40]  # every step, then every 10
    np.testing.assert_array_equal(dense.test_loss[[0, 10, 13, 14, 15]], a.test_loss)
    held = sample_sequences([3 + HELD_OUT, 4 + HELD_OUT], seq_len=SMALL["seq_len"])
    at_start = causal_head_loss_fn(held.x, held.y)(init_heads([3, 4])).loss.numpy()
    np.testing.assert_allclose(a.test_loss[0], at_start, rtol=0, atol=0)
    assert (a.train_loss[-1] < a.train_loss[0]).all()  # it trains (held out, a short sequence may not gain)


def test_a_seed_that_diverges_alone_leaves_the_others_as_they_were():
    """Runs are independent: one seed's divergence reads inf for that seed and leaves the
    others' numbers as a trial without it gives them."""
    import attention_dynamics.tuning as tuning

    both = run_trial("SGD", 0.05, [3, 4], **SMALL)
    real = tuning.train
    calls = []

    def flaky(params, loss_fn, rule, n_steps, **kw):
        calls.append(params["W_Q"].shape[0])
        if len(calls) == 1:  # the first attempt: run 0 (seed 3) blows up at step 7
            raise tuning.TrainingDiverged(7, "a test", 0)
        return real(params, loss_fn, rule, n_steps, **kw)

    tuning.train = flaky
    try:
        one = run_trial("SGD", 0.05, [3, 4], **SMALL)
    finally:
        tuning.train = real
    assert calls == [2, 1] and one.diverged_seeds == {3: 7} and one.diverged_at is None
    assert np.isinf(one.test_loss[:, 0]).all() and np.isinf(one.final_test[0])
    np.testing.assert_allclose(one.test_loss[:, 1], both.test_loss[:, 1], rtol=1e-6)
    assert np.isnan(steps_to_reach(one, 2.0)[0])


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


def test_choose_backs_off_one_grid_step_from_the_edge_of_stability():
    def fake(lr, final):
        return Trial("SGD", lr, [0], None, np.array([0]), np.array([[final]]), None, 0.0)
    final = lambda t: float(np.mean(t.final_test))  # noqa: E731
    grid = [fake(0.1, 2.3), fake(0.3, 2.2), fake(1.0, 2.0), fake(3.0, np.inf), fake(10.0, np.inf)]
    assert choose(grid, final) == (0.3, True)  # 1.0 is best, but 3.0 diverged: one step back
    assert choose(grid, final, back_off=False) == (1.0, True)
    safe = [fake(0.1, 2.3), fake(0.3, 2.0), fake(1.0, 2.1), fake(3.0, np.inf)]
    assert choose(safe, final) == (0.3, True)  # its larger neighbour is finite: no back-off
    edge = [fake(0.1, np.inf), fake(0.3, 2.0), fake(1.0, np.inf)]
    assert choose(edge, final) == (0.3, True)  # every finite rate at the edge: the best of them
    top = [fake(0.1, 2.3), fake(0.3, 2.2), fake(1.0, 2.0)]
    assert choose(top, final) == (1.0, False)  # the grid's end has no larger neighbour


def test_steps_to_reach_reads_the_first_evaluation_at_or_below_the_level():
    t = Trial("SGD", 0.1, [0, 1], None, np.array([0, 10, 20]), np.array([[2.1, 2.1], [2.0, 2.05], [1.9, 2.05]]),
              None, 0.0)
    np.testing.assert_array_equal(steps_to_reach(t, 2.0), [10.0, np.nan])
    np.testing.assert_array_equal(steps_to_reach(t, 2.05), [10.0, 10.0])


def test_the_tuned_comparison_can_say_ahead_and_same():
    """The rule's controls on the EM task, where a run is cheap and has no held-out noise:
    EM-style at half its rate needs about twice the steps to the threshold, ln 2 against the
    margin ln 1.25, so it must come out slower by more than the margin; EM-style's twin at
    its rate x 1.05 (about 5% fewer steps, ln 1.05) must come out the same."""
    from attention_dynamics.rules import steps_advantage
    from attention_dynamics.tasks.clusters import make_cluster_task

    task, seeds = make_cluster_task(3, 30, 6, spread=0.3, seed=0), [0, 1, 2, 3, 4]
    setup = dict(task=task, ratio=10.0, n_steps=600)
    steps = {name: steps_below(run_cluster_trial("EM-style", lr, seeds, **setup), 0.2).tolist()
             for name, lr in (("EM-style", 0.3), ("half", 0.15), ("twin", 0.315))}
    assert all(np.isfinite(x).all() for x in steps.values()), steps
    slower = steps_advantage(steps["half"], steps["EM-style"], 600)
    assert slower.verdict == HOLDS, slower
    twin = steps_advantage(steps["twin"], steps["EM-style"], 600)
    assert twin.verdict == FAILS and twin.why.startswith(SAME), twin
    itself = steps_advantage(steps["EM-style"], steps["EM-style"], 600)
    assert itself.why.startswith(SAME)


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
    assert reach_score(steps) == pytest.approx(np.log(steps).mean())
    assert reach_score(steps_below(t, 1e-9)) == math.inf  # never reached on some seed: no finite score
    assert as_record([3.0, np.nan]) == [3.0, None]
    gone = run_cluster_trial("SGD", 1e4, [0, 1], task=task, ratio=10.0, n_steps=50)
    assert gone.diverged_at is not None and np.isnan(steps_below(gone, 0.2)).all()


def test_step_seconds_times_every_arm():
    times = step_seconds({"SGD": ("SGD", 0.01), "Adam": ("Adam", 0.01)}, [1, 2], ratio=10.0, seq_len=100,
                         steps=2, rounds=2)
    assert set(times) == {"SGD", "Adam"} and all(0 < x < 10 for x in times.values())
