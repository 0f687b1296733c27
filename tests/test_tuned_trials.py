"""The fair comparison's stored trials (attention_dynamics.tuned_trials): a stored trial is
the trial run in place, bit for bit, whether it was made or loaded, diverged seeds and
whole diverged trials included; its arguments are checked by name; and the rules that turn
tuning into the test's arms (attention_dynamics.tuned_arms) give the arms the chapter names.
Each test has a store of its own, so that none loads what another made."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import attention_dynamics.tuning as tuning
from attention_dynamics.tuned_arms import (check_seeds_apart, cluster_arms, cluster_score, held_out_levels,
                                           method_grids, sticky_arms, sticky_score, tuned_rates)
from attention_dynamics.tuned_trials import CLUSTER_TASK, StoredTrial, cluster_task, cluster_trial, sticky_trial
from attention_dynamics.tuning import Trial, run_cluster_trial, run_trial, steps_below, steps_to_reach

SMALL = dict(ratio=10.0, n_steps=40, seq_len=300, eval_every=10, dense_until=5)
CLUSTER = dict(task_seed=0, ratio=10.0, n_steps=60)


@pytest.fixture(autouse=True)
def own_store(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path / "store"))


def assert_same_trial(stored: Trial, direct: Trial) -> None:
    """Every field but the wall time equal, arrays bit for bit and of the same dtype."""
    assert isinstance(stored, StoredTrial)
    for f in dataclasses.fields(Trial):
        a, b = getattr(stored, f.name), getattr(direct, f.name)
        if f.name == "seconds":
            assert isinstance(a, float) and a > 0
        elif isinstance(b, np.ndarray):
            assert a.dtype == b.dtype, f.name
            np.testing.assert_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name


def test_a_stored_sticky_trial_is_the_trial_made_and_loaded():
    direct = run_trial("EM-style", 0.05, [3, 4], **SMALL)
    made = sticky_trial("EM-style", 0.05, [3, 4], **SMALL)
    loaded = sticky_trial("EM-style", 0.05, [3, 4], **SMALL)
    assert made.provenance["loaded"] is False and loaded.provenance["loaded"] is True
    assert made.provenance["path"] == loaded.provenance["path"]
    assert_same_trial(made, direct)
    assert_same_trial(loaded, direct)
    assert loaded.seconds == made.seconds  # the time it took where it was made
    assert sticky_trial("EM-style", 0.05, [3, 4], **SMALL | {"n_steps": 41}).provenance["loaded"] is False


def test_a_seed_that_diverged_alone_is_stored_as_such(monkeypatch):
    real = tuning.train
    calls = []

    def flaky(params, loss_fn, rule, n_steps, **kw):
        calls.append(1)
        if len(calls) == 1:  # the first attempt: run 0 (seed 5) blows up at step 7
            raise tuning.TrainingDiverged(7, "a test", 0)
        return real(params, loss_fn, rule, n_steps, **kw)

    monkeypatch.setattr(tuning, "train", flaky)
    made = sticky_trial("SGD", 0.05, [5, 6], **SMALL)
    monkeypatch.setattr(tuning, "train", real)
    loaded = sticky_trial("SGD", 0.05, [5, 6], **SMALL)
    assert loaded.provenance["loaded"] and made.diverged_seeds == loaded.diverged_seeds == {5: 7}
    assert_same_trial(loaded, made)
    assert np.isinf(loaded.test_loss[:, 0]).all() and np.isfinite(loaded.test_loss[:, 1]).all()


def test_a_stored_cluster_trial_is_the_trial_made_and_loaded_diverged_or_not():
    task = cluster_task(0)
    for lr in (1.0, 1e4):  # the second diverges on every seed: no curves, a step
        direct = run_cluster_trial("SGD", lr, [0, 1], task=task, ratio=10.0, n_steps=60)
        made = cluster_trial("SGD", lr, [0, 1], **CLUSTER)
        loaded = cluster_trial("SGD", lr, [0, 1], **CLUSTER)
        assert loaded.provenance["loaded"] and not made.provenance["loaded"]
        assert_same_trial(made, direct)
        assert_same_trial(loaded, direct)
    assert loaded.diverged_at is not None and loaded.train_loss is None


def test_the_cluster_task_is_the_chapters():
    from attention_dynamics.tasks.clusters import make_cluster_task

    a, b = cluster_task(3), make_cluster_task(3, 30, 6, spread=0.3, seed=3)
    assert CLUSTER_TASK == {"n_clusters": 3, "per_cluster": 30, "d_x": 6, "spread": 0.3}
    assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("x", "cluster", "centers", "memory"))


@pytest.mark.parametrize("call, name", [
    (lambda: sticky_trial("Nesterov", 0.1, [1], **SMALL), "method"),
    (lambda: sticky_trial("SGD", 0.0, [1], **SMALL), "lr"),
    (lambda: sticky_trial("SGD", 0.1, [-1], **SMALL), "seeds"),
    (lambda: sticky_trial("SGD", 0.1, [1], **SMALL | {"ratio": -1.0}), "ratio"),
    (lambda: sticky_trial("SGD", 0.1, [1], **SMALL | {"n_steps": 0}), "n_steps"),
    (lambda: sticky_trial("SGD", 0.1, [1], **SMALL | {"seq_len": 2}), "seq_len"),
    (lambda: sticky_trial("SGD", 0.1, [1], **SMALL | {"eval_every": 0}), "eval_every"),
    (lambda: sticky_trial("SGD", 0.1, [1], **SMALL | {"dense_until": -1}), "dense_until"),
    (lambda: sticky_trial("SGD", "0.1", [1], **SMALL), "lr"),
    (lambda: sticky_trial("SGD", 0.1, 1, **SMALL), "seeds"),
    (lambda: cluster_trial("SGD", 0.1, [1], **CLUSTER | {"task_seed": -1}), "task_seed"),
    (lambda: cluster_trial("SGD", 0.1, [1], **CLUSTER | {"n_steps": 0}), "n_steps"),
    (lambda: method_grids([1, 2], [1, 2], [1, 2, 3], "cluster "), "cluster grid"),
    (lambda: method_grids([1, 2], [2, 1], [1, 2]), "Adam grid must be increasing"),
    (lambda: method_grids([1, 1], [1, 2], [1, 2]), "SGD grid must be increasing"),
    (lambda: method_grids([1, 2], [1, 2], [0, 2]), "base grid"),
    (lambda: check_seeds_apart([1, 2], [10_002], [0], [1]), "tuning_seeds"),
    (lambda: check_seeds_apart([1, 2], [3], [0, 1], [1]), "cluster_tuning_seeds"),
    (lambda: held_out_levels([1], seq_len=300, level_fraction=0.0), "level_fraction"),
])
def test_bad_arguments_are_refused_by_name(call, name):
    with pytest.raises((TypeError, ValueError), match=name):
        call()


def test_the_arms_are_each_method_at_its_rate_the_references_and_the_two_controls():
    chosen = {"SGD": (0.3, True), "Adam": (0.01, True), "EM-style": (0.1, True), "fast routing": (1.0, False),
              "fast W_O": (0.1, True)}
    arms = sticky_arms(chosen, 0.01)
    assert list(arms) == [*chosen, "protocol SGD", "protocol EM-style", "control: EM-style at half its rate",
                          "control: EM-style twin"]
    assert arms["SGD"] == ("SGD", 0.3) and arms["protocol EM-style"] == ("EM-style", 0.01)
    assert arms["control: EM-style at half its rate"] == ("EM-style", 0.05)
    assert arms["control: EM-style twin"] == ("EM-style", 0.1 * 1.05)
    c = cluster_arms(chosen, 0.1)
    assert list(c)[5:7] == ["chapter's ratio 1", "chapter's ratio 10"]
    assert c["chapter's ratio 1"] == ("SGD", 0.1) and c["chapter's ratio 10"] == ("EM-style", 0.1)
    check_seeds_apart([1, 2], [42, 2024], [100, 101], [0, 1])  # the chapter's seeds: apart
    grids = method_grids([1, 2], [3, 4], [5, 6])
    assert list(grids) == list(tuning.METHODS) and grids["fast W_O"] == [5, 6] and grids["Adam"] == [3, 4]


def test_the_scores_and_choices_are_the_tuning_modules():
    """The chapter and its plan's follow-up choose by these: the mean log steps to the level
    (sticky chain) or below the threshold (EM task), and tuning.choose."""
    levels, floor = held_out_levels([1, 2], seq_len=300, level_fraction=0.3)
    assert (levels > floor).all() and (levels < np.log(8)).all()
    t = sticky_trial("SGD", 0.3, [1, 2], **SMALL)
    assert sticky_score(levels)(t) == tuning.reach_score(steps_to_reach(t, levels))
    assert sticky_score(levels + 1.0)(t) == tuning.reach_score(steps_to_reach(t, levels + 1.0)) < np.inf
    trials = [cluster_trial("SGD", lr, [0, 1], **CLUSTER) for lr in (0.1, 1.0, 10.0)]
    score = cluster_score(1.0)
    assert [score(t) for t in trials] == [tuning.reach_score(steps_below(t, 1.0)) for t in trials]
    assert np.isfinite([score(t) for t in trials]).any()
    assert tuned_rates({"SGD": trials}, score) == {"SGD": tuning.choose(trials, score)}
