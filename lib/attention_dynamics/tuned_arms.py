"""From tuning to the test (chapter *Is it EM or the learning rate?*): the grids by method,
the seeds kept apart, the sticky chain's held-out levels, the scores and the choice of each
method's rate, and the test's arms. The chapter and the build's follow-up
(:mod:`attention_dynamics.book.plans`) both apply these, so that the test trials a build makes
first (:mod:`attention_dynamics.tuned_trials`) are the ones the chapter asks for.
"""
from __future__ import annotations

import math

import numpy as np

from .tasks import sticky_chain as sc
from .tuning import HELD_OUT, Trial, choose, reach_score, steps_below, steps_to_reach
from .validation import check_float, check_float_list, check_int, check_int_list

__all__ = ["method_grids", "check_seeds_apart", "held_out_levels", "sticky_score", "cluster_score", "tuned_rates",
           "sticky_arms", "cluster_arms"]


def method_grids(sgd, adam, base, what: str = "") -> dict[str, list[float]]:
    """A task's grids by method: SGD's, Adam's, and ``base`` for the three schedules that
    move one group fast. One length for all (one budget), else ValueError naming ``what``."""
    checked = {}
    for name, grid in (("SGD", sgd), ("Adam", adam), ("base", base)):
        grid = check_float_list(f"the {what}{name} grid", grid, 0.0, None, low_open=True, min_len=2)
        if sorted(set(grid)) != grid:
            raise ValueError(f"the {what}{name} grid must be increasing rates without repeats, got {grid}")
        checked[name] = grid
    grids = {"SGD": checked["SGD"], "Adam": checked["Adam"], "EM-style": checked["base"],
             "fast routing": checked["base"], "fast W_O": checked["base"]}
    sizes = {m: len(g) for m, g in grids.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every {what}grid must have the same length, got {sizes}")
    return grids


def check_seeds_apart(tuning_seeds, test_seeds, cluster_tuning_seeds, cluster_test_seeds) -> None:
    """ValueError unless the tuning seeds share no training or held-out sequence (seed +
    HELD_OUT) with the test seeds, and the EM task's tuning and test seeds no seed."""
    def both(name, seeds):
        seeds = check_int_list(name, seeds, 0, 2**31 - 1 - HELD_OUT)
        return set(seeds) | {s + HELD_OUT for s in seeds}

    if both("tuning_seeds", tuning_seeds) & both("test_seeds", test_seeds):
        raise ValueError(f"tuning_seeds {list(tuning_seeds)} and test_seeds {list(test_seeds)} must "
                         "not share a training or held-out sequence")
    if set(cluster_tuning_seeds) & set(cluster_test_seeds):
        raise ValueError("cluster_tuning_seeds and cluster_test_seeds must not share a "
                         f"seed, got {list(cluster_tuning_seeds)} and {list(cluster_test_seeds)}")


def held_out_levels(seeds, *, seq_len: int, level_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Each seed's level on its held-out sequence (``level_fraction`` of the way from ln 8
    down to the forward filter's loss there), and that loss."""
    level_fraction = check_float("level_fraction", level_fraction, 0.0, 1.0, low_open=True)
    seq = sc.sample_sequences([s + HELD_OUT for s in seeds], seq_len=check_int("seq_len", seq_len, 3, None))
    floor = sc.predictor_loss(sc.forward_filter, seq).numpy()
    return math.log(8) - level_fraction * (math.log(8) - floor), floor


def sticky_score(levels):
    """The sticky chain's tuning score of a trial: the mean log steps to each seed's held-out
    ``levels`` (infinite unless every seed reached its level)."""
    return lambda t: reach_score(steps_to_reach(t, levels))


def cluster_score(threshold: float):
    """The EM task's tuning score of a trial: the mean log steps until the training loss
    first falls below ``threshold`` nats (infinite unless every seed's does)."""
    return lambda t: reach_score(steps_below(t, threshold))


def tuned_rates(tuning: dict[str, list[Trial]], score) -> dict[str, tuple[float, bool]]:
    """Each method's chosen rate and whether its grid brackets it
    (:func:`attention_dynamics.tuning.choose` by ``score``)."""
    return {m: choose(trials, score) for m, trials in tuning.items()}


def _arms(chosen: dict[str, tuple[float, bool]], references: dict[str, tuple[str, float]]) -> dict:
    arms = {m: (m, lr) for m, (lr, _) in chosen.items()}
    arms |= references
    arms["control: EM-style at half its rate"] = ("EM-style", chosen["EM-style"][0] / 2)
    arms["control: EM-style twin"] = ("EM-style", chosen["EM-style"][0] * 1.05)
    return arms


def sticky_arms(chosen: dict[str, tuple[float, bool]], protocol_lr: float) -> dict[str, tuple[str, float]]:
    """The sticky chain's test arms, name -> (method, base rate): each method at its chosen
    rate, the protocol's two runs at its rate, and EM-style at half its rate and at its
    rate x 1.05, the rules' controls."""
    return _arms(chosen, {"protocol SGD": ("SGD", protocol_lr), "protocol EM-style": ("EM-style", protocol_lr)})


def cluster_arms(chosen: dict[str, tuple[float, bool]], routing_lr: float) -> dict[str, tuple[str, float]]:
    """The EM task's test arms: each method at its chosen rate, the chapter's own sweep at
    ratios 1 and 10 at its routing rate, and the same two controls."""
    return _arms(chosen, {"chapter's ratio 1": ("SGD", routing_lr), "chapter's ratio 10": ("EM-style", routing_lr)})
