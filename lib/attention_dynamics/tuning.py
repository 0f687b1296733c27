"""Baselines tuned as carefully as the method: is it EM, or the learning rate? (R6, R7;
chapter *Is it EM or the learning rate?*)

The paper's EM-style schedule is plain SGD with the values (W_V) at ten times the rate of
everything else. Against SGD at the protocol's one rate it wins; the question a reader asks
first is whether SGD, or Adam, with its own rate tuned as carefully, closes the gap. Each
*method* here is an optimizer and a rate multiplier per role (:data:`METHODS`); a *trial*
trains the sticky-chain head of the protocol with one method at one base rate on a set of
seeds, full batch on each seed's training sequence, and tracks the loss on a held-out
sequence of the same chain (seed + :data:`HELD_OUT`), because a tuned rate can push the
training-sequence loss below what any predictor reaches on fresh data.

Tuning gives every method the same budget, one trial per point of a grid of the same
length, on tuning seeds kept apart from the test seeds; the chosen rate is the one with the
lowest mean held-out loss at the last step (a diverged trial counts as infinitely bad), and
is fixed before any test seed runs (Schmidt, Schneider and Hennig, *Descending through a
Crowded Valley*, ICML 2021).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch
from torch import Tensor

from .causal_head import causal_head_loss_fn, init_heads
from .tasks.sticky_chain import sample_sequences
from .training import SGD, TrainingDiverged, head_rates, train
from .validation import check_float, check_float_list, check_int, check_int_list

__all__ = ["Adam", "METHODS", "HELD_OUT", "method_rates", "Trial", "run_trial", "tune", "choose", "steps_to_reach"]

HELD_OUT = 10_000  # a seed's held-out sequence is drawn with seed + HELD_OUT (as on the beyond page)

# method -> (optimizer, the roles whose rate is ``ratio`` times the base rate)
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "SGD": ("sgd", ()),
    "Adam": ("adam", ()),
    "EM-style": ("sgd", ("values",)),  # the paper's schedule: W_V fast
    "fast routing": ("sgd", ("routing",)),  # control: W_Q, W_K fast instead
    "fast W_O": ("sgd", ("other",)),  # control: the read-out fast instead
}


def method_rates(method: str, lr: float, ratio: float) -> dict[str, float]:
    """The rate of each role: ``lr``, and ``ratio * lr`` for the method's fast roles."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    lr = check_float("lr", lr, 0.0, None, low_open=True)
    ratio = check_float("ratio", ratio, 0.0, None, low_open=True)
    fast = METHODS[method][1]
    return {role: lr * ratio if role in fast else lr for role in ("routing", "values", "other")}


class Adam:
    """Adam (Kingma and Ba), the update of ``torch.optim.Adam`` (no weight decay, no AMSGrad),
    an update rule for :func:`attention_dynamics.training.train` with its rates given as
    :class:`~attention_dynamics.training.SGD` takes them: one for every parameter, by name,
    or a tensor of one rate per batched run. Adam acts on each entry of each parameter on
    its own, so R runs stacked on a leading dimension step exactly as R separate optimizers
    would; ``torch.optim.Adam`` takes one rate per tensor and cannot batch them. (It lives
    here, beside the one experiment that uses it, so that adding it changed no stored
    model's key; its home is :mod:`attention_dynamics.training`.)"""

    def __init__(self, lr: float | Mapping[str, float | Tensor], *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self._rates = SGD(lr)  # the same rate forms, checked the same way
        if len(betas) != 2:
            raise ValueError(f"betas must be two numbers, got {betas}")
        self.betas = tuple(check_float(f"betas[{i}]", b, 0.0, 1.0, high_open=True) for i, b in enumerate(betas))
        self.eps = check_float("eps", eps, 0.0, None)
        self.t, self.m, self.v = 0, {}, {}

    def __call__(self, params, out, step):
        b1, b2 = self.betas
        self.t += 1
        bias1, bias2_sqrt = 1 - b1 ** self.t, math.sqrt(1 - b2 ** self.t)
        with torch.no_grad():
            for name, g in out.grads.items():
                m = self.m.setdefault(name, torch.zeros_like(g))
                v = self.v.setdefault(name, torch.zeros_like(g))
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / bias2_sqrt).add_(self.eps)
                params[name].sub_(self._rates.rate(name, params[name]) / bias1 * m / denom)


@dataclass
class Trial:
    """One method at one base rate on some seeds (runs batched, one per seed)."""

    method: str
    lr: float
    seeds: list[int]
    train_loss: np.ndarray | None  # (n_steps + 1, seeds); None if the trial diverged
    eval_steps: np.ndarray  # the steps at which the held-out loss was taken
    test_loss: np.ndarray | None  # (len(eval_steps), seeds)
    diverged_at: int | None  # the step whose evaluation failed, or None
    seconds: float  # wall time of the training loop, all seeds together

    @property
    def final_test(self) -> np.ndarray:
        """Held-out loss per seed at the last step (inf for a diverged trial)."""
        return np.full(len(self.seeds), np.inf) if self.test_loss is None else self.test_loss[-1]


def run_trial(method: str, lr: float, seeds, *, ratio: float, n_steps: int, seq_len: int, block: int = 64,
              eval_every: int = 10, max_loss: float = 20.0) -> Trial:
    """Train the protocol's head (:func:`causal_head.init_heads`, std 0.1, the seeds' own
    training sequences) with ``method`` at base rate ``lr`` for ``n_steps`` full-batch steps,
    taking the held-out loss every ``eval_every`` steps and at the last. A loss above
    ``max_loss`` nats (ln 8 = 2.08 is the uniform guess) or a non-finite one stops the trial
    as diverged, with the step."""
    seeds = check_int_list("seeds", list(seeds), 0, 2**31 - 1 - HELD_OUT)
    n_steps = check_int("n_steps", n_steps, 1, None)
    seq_len = check_int("seq_len", seq_len, 3, None)
    eval_every = check_int("eval_every", eval_every, 1, None)
    rates = head_rates(method_rates(method, lr, ratio))
    rule = Adam(rates) if METHODS[method][0] == "adam" else SGD(rates)
    train_seq = sample_sequences(seeds, n_states_seq=seq_len)
    test_seq = sample_sequences([s + HELD_OUT for s in seeds], n_states_seq=seq_len)
    held_out_fn = causal_head_loss_fn(test_seq.x, test_seq.y, block=block)

    def held_out(step, p, out):
        with torch.no_grad():
            return held_out_fn(p).loss.clone()

    start = time.perf_counter()
    try:
        h = train(init_heads(seeds), causal_head_loss_fn(train_seq.x, train_seq.y, block=block), rule, n_steps,
                  callback=held_out, every=eval_every, max_loss=max_loss)
    except TrainingDiverged as e:
        return Trial(method, float(lr), seeds, None, np.array([]), None, e.step, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    return Trial(method, float(lr), seeds, h.loss, h.steps, np.stack([c.numpy() for _, c in h.checkpoints]),
                 None, seconds)


def tune(method: str, grid, seeds, *, progress: bool = False, **kw) -> list[Trial]:
    """One trial per rate of ``grid`` on the tuning ``seeds`` (keywords as :func:`run_trial`),
    with a progress bar over the grid if ``progress``."""
    grid = check_float_list("grid", grid, 0.0, None, low_open=True, min_len=2)
    if sorted(set(grid)) != grid:
        raise ValueError(f"grid must be increasing rates without repeats, got {grid}")
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc=f"tuning {method}", leave=False)
    return [run_trial(method, lr, seeds, **kw) for lr in grid]


def choose(trials: list[Trial]) -> tuple[float, bool]:
    """The rate with the lowest mean held-out loss at the last step, and whether it is
    bracketed: an inner point of the grid, so that a better rate is not likely to lie past an
    end. A diverged trial counts as infinitely bad; if every trial diverged there is no
    choice (ValueError)."""
    means = [float(np.mean(t.final_test)) for t in trials]
    if not np.isfinite(means).any():
        raise ValueError(f"every trial of {trials[0].method} diverged: widen the grid toward smaller rates")
    best = int(np.argmin(means))
    return trials[best].lr, 0 < best < len(trials) - 1


def steps_to_reach(trial: Trial, level: float) -> np.ndarray:
    """Per seed, the first evaluated step whose held-out loss is at or below ``level`` (NaN if
    none; the resolution is the trial's ``eval_every``)."""
    if trial.test_loss is None:
        return np.full(len(trial.seeds), np.nan)
    hit = trial.test_loss <= level
    return np.array([trial.eval_steps[np.argmax(hit[:, r])] if hit[:, r].any() else math.nan
                     for r in range(hit.shape[1])], dtype=float)
