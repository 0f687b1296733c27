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

The same methods run on the two-timescale EM task of R6 (:func:`run_cluster_trial`), where
the claim is about speed on the task itself: the score there is the number of steps until
the training loss first falls below a threshold.

Tuning gives every method the same budget, one trial per point of a grid of the same
length, on tuning seeds kept apart from the test seeds; the chosen rate is the one with the
lowest mean held-out loss averaged over the run (the area under the held-out curve: a
method that is fast and one that ends low both score; the paper's claim is about speed, and
the loss at the last step alone would let every method's rate be tuned until it just
reaches the same floor by then); a diverged trial counts as infinitely bad, and a rate
next to one that diverged is passed over for the best rate one grid step further from the
edge of stability. The choice is fixed before any test seed runs (Schmidt, Schneider and
Hennig, *Descending through a Crowded Valley*, ICML 2021).
"""
from __future__ import annotations

import math
import time
import dataclasses
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch
from torch import Tensor

from .causal_head import causal_head_loss_fn, init_heads
from .stats import first_step_below, first_true
from .tasks.sticky_chain import sample_sequences
from .training import SGD, TrainingDiverged, head_rates, train
from .validation import check_float, check_float_list, check_int, check_int_list

__all__ = ["Adam", "METHODS", "HELD_OUT", "method_rates", "Trial", "run_trial", "run_cluster_trial", "step_seconds",
           "tune", "choose", "steps_to_reach", "steps_below", "reach_score", "as_record"]

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
    diverged_at: int | None  # the step at which the trial as a whole diverged (every seed), or None
    seconds: float  # wall time of the training loop, all seeds together
    diverged_seeds: dict[int, int] = dataclasses.field(default_factory=dict)  # seed -> step, seeds that diverged alone

    @property
    def final_test(self) -> np.ndarray:
        """Held-out loss per seed at the last step (inf for a diverged trial, NaN for a trial
        without a held-out set)."""
        if self.diverged_at is not None:
            return np.full(len(self.seeds), np.inf)
        return np.full(len(self.seeds), np.nan) if self.test_loss is None else self.test_loss[-1]

    @property
    def test_auc(self) -> np.ndarray:
        """Held-out loss per seed averaged over the run: the area under the held-out curve
        (trapezoids between the evaluated steps) over the number of steps. It rewards a
        method that gets low early as well as one that ends low: speed and level together.
        Inf for a diverged trial, NaN without a held-out set."""
        if self.diverged_at is not None:
            return np.full(len(self.seeds), np.inf)
        if self.test_loss is None:
            return np.full(len(self.seeds), np.nan)
        steps, loss = self.eval_steps.astype(float), self.test_loss
        if steps[-1] == steps[0]:
            return loss[-1]
        area = ((loss[1:] + loss[:-1]) / 2 * np.diff(steps)[:, None]).sum(0)
        return area / (steps[-1] - steps[0])


def _train_together(sub: list[int], method: str, rates, *, n_steps: int, seq_len: int, block: int,
                    eval_every: int, dense_until: int, max_loss: float):
    """Train the heads of the seeds ``sub`` together (:func:`run_trial`'s schedule of
    held-out evaluations); their history, or :class:`TrainingDiverged` naming the run."""
    train_seq = sample_sequences(sub, seq_len=seq_len)
    test_seq = sample_sequences([s + HELD_OUT for s in sub], seq_len=seq_len)
    held_out_fn = causal_head_loss_fn(test_seq.x, test_seq.y, block=block)

    def held_out(step, p, out):
        if step > dense_until and step % eval_every and step != n_steps:
            return None
        with torch.no_grad():
            loss = held_out_fn(p).loss.clone()
        bad = ~torch.isfinite(loss)
        if bool(bad.any()):
            raise TrainingDiverged(step, "the held-out loss is not finite", int(bad.nonzero()[0]))
        return loss

    rule = Adam(rates) if METHODS[method][0] == "adam" else SGD(rates)
    return train(init_heads(sub), causal_head_loss_fn(train_seq.x, train_seq.y, block=block), rule, n_steps,
                 callback=held_out, every=1, max_loss=max_loss)


def run_trial(method: str, lr: float, seeds, *, ratio: float, n_steps: int, seq_len: int, block: int = 64,
              eval_every: int = 10, dense_until: int = 200, max_loss: float = 20.0) -> Trial:
    """Train the protocol's head (:func:`causal_head.init_heads`, std 0.1, the seeds' own
    training sequences) with ``method`` at base rate ``lr`` for ``n_steps`` full-batch steps,
    taking the held-out loss at every step up to ``dense_until``, then every ``eval_every``
    steps and at the last: a tuned method may reach a level within tens of steps, where a
    coarse grid of evaluations would round its speed by more than the margins of the rules
    (a step in 20 is 5%). A training loss above
    ``max_loss`` nats (ln 8 = 2.08 is the uniform guess), or a non-finite training or
    held-out loss, stops that seed's run as diverged: the other seeds are trained again
    without it (each run is independent of the others), and the diverged seed's losses read
    inf (it never reaches any level). The trial as a whole diverged only if every seed did,
    or if the cause could not be traced to one run."""
    seeds = check_int_list("seeds", list(seeds), 0, 2**31 - 1 - HELD_OUT)
    n_steps = check_int("n_steps", n_steps, 1, None)
    seq_len = check_int("seq_len", seq_len, 3, None)
    eval_every = check_int("eval_every", eval_every, 1, None)
    dense_until = check_int("dense_until", dense_until, 0, None)
    rates = head_rates(method_rates(method, lr, ratio))

    def batch(idx):
        return _train_together([seeds[i] for i in idx], method, rates, n_steps=n_steps, seq_len=seq_len,
                               block=block, eval_every=eval_every, dense_until=dense_until, max_loss=max_loss)

    start, alive, gone = time.perf_counter(), list(range(len(seeds))), {}
    while alive:
        try:
            h = batch(alive)
            break
        except TrainingDiverged as e:
            if e.run is None:  # not traceable to one run: all of them
                gone.update({i: e.step for i in alive})
                alive = []
            else:
                gone[alive.pop(e.run)] = e.step
    seconds = time.perf_counter() - start
    if not alive:
        return Trial(method, float(lr), seeds, None, np.array([]), None, min(gone.values()), seconds)
    evals = [(step, c) for step, c in h.checkpoints if c is not None]
    train_loss = np.full((n_steps + 1, len(seeds)), np.inf)
    test_loss = np.full((len(evals), len(seeds)), np.inf)
    train_loss[:, alive] = h.loss.reshape(n_steps + 1, len(alive))
    test_loss[:, alive] = np.stack([c.numpy() for _, c in evals]).reshape(len(evals), len(alive))
    return Trial(method, float(lr), seeds, train_loss, np.array([step for step, _ in evals]), test_loss, None, seconds,
                 {seeds[i]: step for i, step in gone.items()})


def run_cluster_trial(method: str, lr: float, seeds, *, task, ratio: float, n_steps: int, d_k: int = 4,
                      d_v: int = 4, init_std: float = 0.5, max_loss: float = 20.0) -> Trial:
    """The two-timescale EM task of R6 (chapter *Attention as a two-timescale EM
    algorithm*): the cross-entropy head reading the cluster task's one-hot memory
    (:class:`~attention_dynamics.tasks.clusters.ClusterTask`), initialized per seed by
    :func:`~attention_dynamics.head.init_memory_head` as the chapter's rate sweep does, trained
    with ``method`` at base rate ``lr`` for ``n_steps`` full-batch steps. The seeds run one
    after another, each on its own: a seed whose run diverges has a loss curve of inf (it
    never reaches anything), the others keep theirs; the trial as a whole diverged only if
    every seed did. There is no held-out set: the task is the data."""
    from .head import init_memory_head
    from .laws import head_loss_fn

    seeds = check_int_list("seeds", list(seeds), 0, 2**31 - 1)
    n_steps = check_int("n_steps", n_steps, 1, None)
    rates = head_rates(method_rates(method, lr, ratio))
    loss_fn = head_loss_fn(task.x[None], task.cluster[None], memory=task.memory[None])
    losses, diverged, start = [], {}, time.perf_counter()
    for s in seeds:
        p = init_memory_head(task.x.shape[1], task.n_slots, task.n_clusters, d_k, d_v, std=init_std, seed=s)
        rule = Adam(rates) if METHODS[method][0] == "adam" else SGD(rates)
        try:
            losses.append(train(p, loss_fn, rule, n_steps, max_loss=max_loss).loss)
        except TrainingDiverged as e:
            losses.append(np.full(n_steps + 1, np.inf))
            diverged[s] = e.step
    seconds = time.perf_counter() - start
    if len(diverged) == len(seeds):
        return Trial(method, float(lr), seeds, None, np.array([]), None, min(diverged.values()), seconds)
    return Trial(method, float(lr), seeds, np.stack(losses, 1), np.array([]), None, None, seconds, diverged)


def step_seconds(arms: dict[str, tuple[str, float]], seeds, *, ratio: float, seq_len: int, block: int = 64,
                 steps: int = 10, rounds: int = 5) -> dict[str, float]:
    """Wall seconds per training step of each arm (name -> (method, rate)), all ``seeds``
    batched as in a trial, without the held-out evaluations: ``rounds`` rounds that time
    ``steps`` steps of every arm in turn, so that a slow spell of a shared machine falls on
    every arm alike; the median over rounds. The first round of each arm also warms up its
    code path and is discarded."""
    seeds = check_int_list("seeds", list(seeds), 0, 2**31 - 1 - HELD_OUT)
    steps = check_int("steps", steps, 1, None)
    rounds = check_int("rounds", rounds, 1, None)
    train_seq = sample_sequences(seeds, seq_len=check_int("seq_len", seq_len, 3, None))
    loss_fn = causal_head_loss_fn(train_seq.x, train_seq.y, block=block)
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds + 1):
        for name, (method, lr) in arms.items():
            rates = head_rates(method_rates(method, lr, ratio))
            rule = Adam(rates) if METHODS[method][0] == "adam" else SGD(rates)
            params = init_heads(seeds)
            start, done = time.perf_counter(), steps + 1  # steps + 1 evaluations
            try:
                train(params, loss_fn, rule, steps)
            except TrainingDiverged as e:
                done = e.step + 1  # it stopped early: what it did, per evaluation
            if r:
                times[name].append((time.perf_counter() - start) / done)
    return {name: float(np.median(t)) for name, t in times.items()}


def tune(method: str, grid, seeds, *, progress: bool = False, trial=run_trial, **kw) -> list[Trial]:
    """One trial per rate of ``grid`` on the tuning ``seeds`` (``trial``: :func:`run_trial`
    or :func:`run_cluster_trial`, with its keywords), with a progress bar over the grid if
    ``progress``."""
    grid = check_float_list("grid", grid, 0.0, None, low_open=True, min_len=2)
    if sorted(set(grid)) != grid:
        raise ValueError(f"grid must be increasing rates without repeats, got {grid}")
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc=f"tuning {method}", leave=False)
    return [trial(method, lr, seeds, **kw) for lr in grid]


def choose(trials: list[Trial], score=None, *, back_off: bool = True) -> tuple[float, bool]:
    """The rate with the lowest score, by default the mean held-out loss averaged over the
    run (:attr:`Trial.test_auc`), and whether it is bracketed: an inner point of the grid, so
    that a better rate is not likely to lie past an end. A diverged trial, or an infinite
    score, counts as infinitely bad; of equal scores the smaller rate wins; if no trial has
    a finite score there is no choice (ValueError).

    With ``back_off``, a rate whose next larger rate on the grid scored infinite (it diverged,
    or never reached the level, on a tuning seed) is at the edge of stability, where other
    seeds may diverge: the choice is the best rate that is not, a margin of one grid step;
    if every finite rate is at the edge, the best of them. The rule was added after the first
    paper build, whose choices on the EM task all sat at that edge and lost test seeds to
    divergence."""
    score = score or (lambda t: float(np.mean(t.test_auc)))
    means = [math.inf if t.diverged_at is not None else score(t) for t in trials]
    finite = [i for i, m in enumerate(means) if math.isfinite(m)]
    if not finite:
        raise ValueError(f"no trial of {trials[0].method} has a finite score (every one diverged or never "
                         "reached the level): widen the grid")
    stable = [i for i in finite if i + 1 == len(means) or math.isfinite(means[i + 1])]
    best = min(stable if back_off and stable else finite, key=lambda i: (means[i], i))
    return trials[best].lr, 0 < best < len(trials) - 1


def steps_to_reach(trial: Trial, level) -> np.ndarray:
    """Per seed, the first evaluated step whose held-out loss is at or below ``level`` (one
    number, or one per seed); NaN if none (a diverged seed never is). The resolution is the
    trial's ``eval_every``."""
    if trial.test_loss is None:
        return np.full(len(trial.seeds), np.nan)
    hit = trial.test_loss <= np.broadcast_to(np.asarray(level, dtype=float), (len(trial.seeds),))
    return first_true(hit, steps=trial.eval_steps)


def steps_below(trial: Trial, threshold: float) -> np.ndarray:
    """Per seed, the first step whose training loss is below ``threshold``: NaN if it never
    is (a diverged run never is), NaN for every seed of a diverged trial."""
    if trial.diverged_at is not None:
        return np.full(len(trial.seeds), np.nan)
    return np.asarray(first_step_below(trial.train_loss, threshold), dtype=float).reshape(len(trial.seeds))


def reach_score(steps) -> float:
    """A tuning score from steps to a level, one per seed: the mean log steps (a geometric
    mean, as the rules compare ratios of steps), infinite unless every seed reached it."""
    steps = np.asarray(steps, dtype=float)
    return float(np.log(np.maximum(steps, 1.0)).mean()) if np.isfinite(steps).all() else math.inf


def as_record(steps) -> list[float | None]:
    """Numbers per seed (steps to a level, final losses) for a record: null where one is not
    finite (a level never reached, a diverged run)."""
    return [None if not np.isfinite(x) else float(x) for x in np.asarray(steps, dtype=float)]
