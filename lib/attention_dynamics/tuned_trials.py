"""The fair comparison's trials, stored (chapter *Is it EM or the learning rate?*).

Each trial of :mod:`attention_dynamics.tuning`, one method at one base rate on some seeds,
of the sticky chain (:func:`sticky_trial`) or of the two-timescale EM task
(:func:`cluster_trial`), is stored under its settings (:mod:`attention_dynamics.artifacts`),
so that a build can make every trial as a task of its own (:mod:`attention_dynamics.book.plans`)
and the chapter loads them. The rules that turn tuning into the test's arms are in
:mod:`attention_dynamics.tuned_arms`, outside this module's imports: a trial's key holds the
code that makes it, and an edit of the rules changes no trial.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .artifacts import load_or_make
from .tasks.clusters import ClusterTask, make_cluster_task
from .tuning import HELD_OUT, Trial, method_rates, run_cluster_trial, run_trial
from .validation import check_int, check_int_list

__all__ = ["CLUSTER_TASK", "StoredTrial", "cluster_task", "sticky_trial", "cluster_trial"]

# R6's task as its chapter draws it: three clusters of 30 points in 6 dimensions
CLUSTER_TASK = {"n_clusters": 3, "per_cluster": 30, "d_x": 6, "spread": 0.3}


@dataclasses.dataclass
class StoredTrial(Trial):
    """A :class:`~attention_dynamics.tuning.Trial` as the store gave it: ``provenance`` says
    where and when it ran, in how many seconds, and whether this call loaded it."""

    provenance: dict = dataclasses.field(default_factory=dict, compare=False)


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
    return {"method": method, "lr": float(lr), "seeds": check_int_list("seeds", seeds, 0, high_seed),
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
