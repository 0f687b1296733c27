"""The fair comparison's trials, stored (chapter *Is it EM or the learning rate?*).

Each trial of :mod:`attention_dynamics.tuning`, one method at one base rate on some seeds,
of the sticky chain (:func:`sticky_trial`) or of the two-timescale EM task
(:func:`cluster_trial`), is stored under its settings (:mod:`attention_dynamics.artifacts`),
so that a build can make every trial as a task of its own (:mod:`attention_dynamics.book.plans`)
and the chapter loads them. The rules that turn the tuning trials into the test's arms
(:func:`held_out_levels`, :func:`sticky_score`, :func:`cluster_score`, :func:`sticky_arms`,
:func:`cluster_arms`) live here too, so that the chapter and the build's follow-up apply the
same ones.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .artifacts import load_or_make
from .tasks import sticky_chain as sc
from .tasks.clusters import ClusterTask, make_cluster_task
from .tuning import (HELD_OUT, METHODS, Trial, choose, method_rates, reach_score, run_cluster_trial, run_trial,
                     steps_below, steps_to_reach)
from .validation import check_float, check_int, check_int_list

__all__ = ["CLUSTER_TASK", "StoredTrial", "method_grids", "cluster_task", "sticky_trial", "cluster_trial",
           "held_out_levels", "sticky_score", "cluster_score", "tuned_rates", "sticky_arms", "cluster_arms"]

# R6's task as its chapter draws it: three clusters of 30 points in 6 dimensions
CLUSTER_TASK = {"n_clusters": 3, "per_cluster": 30, "d_x": 6, "spread": 0.3}


@dataclasses.dataclass
class StoredTrial(Trial):
    """A :class:`~attention_dynamics.tuning.Trial` as the store gave it: ``provenance`` says
    where and when it ran, in how many seconds, and whether this call loaded it."""

    provenance: dict = dataclasses.field(default_factory=dict, compare=False)


def method_grids(sgd, adam, base, what: str = "") -> dict[str, list[float]]:
    """A task's grids by method: SGD's, Adam's, and ``base`` for the three schedules that
    move one group fast. One length for all (one budget), else ValueError naming ``what``."""
    grids = {"SGD": list(sgd), "Adam": list(adam), "EM-style": list(base), "fast routing": list(base),
             "fast W_O": list(base)}
    sizes = {m: len(g) for m, g in grids.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every {what}grid must have the same length, got {sizes}")
    return grids


def cluster_task(seed: int) -> ClusterTask:
    """The two-timescale EM task's data (:data:`CLUSTER_TASK`), drawn with ``seed``."""
    return make_cluster_task(**CLUSTER_TASK, seed=seed)


def _as_tensor(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def _stored(kind: str, settings: dict, run) -> StoredTrial:
    """The trial ``run()`` makes, loaded when stored under ``settings`` (bit for bit: arrays
    keep their dtype)."""

    def make() -> dict:
        t = run()
        return {"train_loss": _as_tensor(t.train_loss), "eval_steps": _as_tensor(t.eval_steps),
                "test_loss": _as_tensor(t.test_loss), "diverged_at": t.diverged_at, "seconds": t.seconds,
                "diverged_seeds": [[s, step] for s, step in t.diverged_seeds.items()]}

    p, provenance = load_or_make(kind, settings, make, modules=[__name__])
    arrays = {k: None if p[k] is None else p[k].numpy() for k in ("train_loss", "eval_steps", "test_loss")}
    return StoredTrial(settings["method"], settings["lr"], list(settings["seeds"]), arrays["train_loss"],
                       arrays["eval_steps"], arrays["test_loss"], p["diverged_at"], p["seconds"],
                       {s: step for s, step in p["diverged_seeds"]}, provenance)


def _checked(method: str, lr: float, seeds, ratio: float, high_seed: int) -> dict:
    method_rates(method, lr, ratio)  # the method's name and the rates, checked by name
    return {"method": method, "lr": float(lr), "seeds": check_int_list("seeds", list(seeds), 0, high_seed),
            "ratio": float(ratio)}


def sticky_trial(method: str, lr: float, seeds, *, ratio: float, n_steps: int, seq_len: int, eval_every: int,
                 dense_until: int) -> StoredTrial:
    """:func:`attention_dynamics.tuning.run_trial` with these arguments, stored."""
    settings = _checked(method, lr, seeds, ratio, 2**31 - 1 - HELD_OUT) | {
        "n_steps": check_int("n_steps", n_steps, 1, None), "seq_len": check_int("seq_len", seq_len, 3, None),
        "eval_every": check_int("eval_every", eval_every, 1, None),
        "dense_until": check_int("dense_until", dense_until, 0, None)}
    kw = {k: settings[k] for k in ("ratio", "n_steps", "seq_len", "eval_every", "dense_until")}
    return _stored("tuning_trial", settings, lambda: run_trial(method, settings["lr"], settings["seeds"], **kw))


def cluster_trial(method: str, lr: float, seeds, *, task_seed: int, ratio: float, n_steps: int) -> StoredTrial:
    """:func:`attention_dynamics.tuning.run_cluster_trial` on :func:`cluster_task` (drawn
    with ``task_seed``), stored."""
    settings = _checked(method, lr, seeds, ratio, 2**31 - 1) | {
        "task_seed": check_int("task_seed", task_seed, 0, 2**31 - 1), "n_steps": check_int("n_steps", n_steps, 1, None)}
    return _stored("cluster_trial", settings,
                   lambda: run_cluster_trial(method, settings["lr"], settings["seeds"], task=cluster_task(task_seed),
                                             ratio=settings["ratio"], n_steps=settings["n_steps"]))


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
