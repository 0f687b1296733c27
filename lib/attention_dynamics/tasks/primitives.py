"""The three inference primitives of R9, each a task with its exact Bayes-optimal predictor
(chapter *Three inference primitives*).

- :class:`Accumulation`: evidence that adds up. Each sequence draws a die's bias theta from a
  Dirichlet(alpha, ..., alpha) prior over ``K`` faces and then rolls it; the task is the next
  roll. Bayes: the Dirichlet posterior predictive (n_k + alpha) / (t + K alpha).
- :class:`Transport`: a belief that moves with a latent state: the sticky Markov chain of R7
  (its transition matrix and symbol means), on short sequences; the next state from noisy
  vectors. Bayes: the forward filter (:func:`attention_dynamics.tasks.sticky_chain.forward_filter`).
- :class:`Binding`: random access by content: ``L`` key-value pairs (distinct keys out of
  ``K``, values uniform out of ``V``), then ``Q`` queries, each a key of the context; the task
  is each query's value. Bayes: the bound value, with certainty.

Each task samples batches from a numpy ``Generator`` (:meth:`sample`: inputs, targets at the
supervised positions) and gives the Bayes predictor's log-probabilities on them
(:meth:`bayes_log_probs`), so that a model's gap to the floor is measured on the very
sequences it is tested on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..validation import check_float, check_int, settings_from_dict
from . import sticky_chain as sc

__all__ = ["Batch", "Accumulation", "Transport", "Binding", "PRIMITIVES", "make_task"]


@dataclass(frozen=True)
class Batch:
    inputs: Tensor  # (n, T) token ids, or (n, T, d_in) float32 vectors
    targets: Tensor  # (n, P): the answers at the supervised positions
    positions: Tensor | None  # (P,) supervised positions of the sequence, None for all


def _check_settings(task, ints: dict, floats: dict | None = None) -> None:
    """Each integer setting within its (low, high), each float within its (low, high],
    named."""
    for name, (low, high) in ints.items():
        check_int(name, getattr(task, name), low, high)
    for name, (low, high) in (floats or {}).items():
        check_float(name, getattr(task, name), low, high, low_open=True)


def _uniform(batch: "Batch", n_out: int) -> Tensor:
    return torch.full((*batch.targets.shape, n_out), -math.log(n_out), dtype=torch.float64)


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


@dataclass(frozen=True)
class Accumulation:
    """Rolls of a die with a Dirichlet(alpha) prior on its bias: predict the next roll."""

    K: int = 4
    T: int = 32
    alpha: float = 1.0

    name = "accumulation"
    input = "tokens"

    def __post_init__(self):
        _check_settings(self, {"K": (2, 256), "T": (1, 100_000)}, {"alpha": (0.0, 1e6)})

    @property
    def n_out(self) -> int:
        return self.K

    @property
    def vocab(self) -> int:
        return self.K

    def sample(self, n: int, rng: np.random.Generator) -> Batch:
        n = check_int("n", n, 1, None)
        rng = _check_rng(rng)
        theta = rng.dirichlet(np.full(self.K, self.alpha), size=n)  # (n, K)
        u = rng.random((n, self.T + 1))
        rolls = (u[..., None] > np.cumsum(theta, -1)[:, None, :-1]).sum(-1)  # inverse CDF
        rolls = torch.as_tensor(rolls, dtype=torch.long)
        return Batch(rolls[:, :-1], rolls[:, 1:], None)

    def baseline_log_probs(self, batch: Batch) -> Tensor:
        """The reference point of the share of the attainable gain: uniform over the faces."""
        return _uniform(batch, self.n_out)

    def bayes_log_probs(self, batch: Batch) -> Tensor:
        """log P(next roll = k | the rolls so far) = log (n_k + alpha) / (t + K alpha): (n, T, K)."""
        counts = torch.nn.functional.one_hot(batch.inputs, self.K).double().cumsum(1)
        t = torch.arange(1, batch.inputs.shape[1] + 1, dtype=torch.float64)[None, :, None]
        return torch.log((counts + self.alpha) / (t + self.K * self.alpha))


@dataclass(frozen=True)
class Transport:
    """The sticky Markov chain of R7 (its symbol means and its transition matrix, built as
    :func:`attention_dynamics.tasks.sticky_chain.transition_matrix` builds it with this
    ``stay`` as the self weight) on sequences of ``T`` positions: from x_1..x_t (x_t =
    mu_{y_(t-1)} + noise eps_t, eps_t ~ N(0, I)), predict y_t. R7's own chain (stay 0.3,
    noise 1) leaves little to transport: each x_t nearly names the last state and the filter
    gains a thousandth of a bit over x_t alone. The default, stay 0.9 seen through noise 3,
    makes the belief carried from step to step worth most of a bit per step."""

    T: int = 32
    stay: float = 0.9
    noise: float = 3.0

    name = "transport"
    input = "linear"
    n_out = sc.N_STATES
    d_in = sc.D_X

    def __post_init__(self):
        _check_settings(self, {"T": (1, 100_000)}, {"noise": (0.0, 100.0)})
        check_float("stay", self.stay, 0.0, 1.0, high_open=True)

    def matrix(self) -> Tensor:
        return sc.transition_matrix(self_weight=self.stay)

    def sample(self, n: int, rng: np.random.Generator) -> Batch:
        """All sequences at once (not the script's per-seed draw order of R7): a uniform
        start, then each state from its row of the transition matrix."""
        n = check_int("n", n, 1, None)
        rng = _check_rng(rng)
        P = self.matrix().numpy()
        cum = np.cumsum(P, -1)
        states = np.empty((n, self.T + 1), dtype=np.int64)
        states[:, 0] = rng.integers(0, sc.N_STATES, n)
        for t in range(self.T):  # vectorized over the batch
            u = rng.random(n)
            states[:, t + 1] = np.minimum((u[:, None] > cum[states[:, t]]).sum(-1), sc.N_STATES - 1)
        eps = rng.standard_normal((n, self.T, sc.D_X))
        x = sc.symbol_means().numpy()[states[:, :-1]] + self.noise * eps
        return Batch(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(states[:, 1:]), None)

    def bayes_log_probs(self, batch: Batch) -> Tensor:
        """The forward filter; N(mu, noise^2 I) read as N(mu / noise, I) of x / noise."""
        return sc.forward_filter(batch.inputs.double() / self.noise, self.matrix(), sc.symbol_means() / self.noise)

    def baseline_log_probs(self, batch: Batch) -> Tensor:
        """The reference point of the share of the attainable gain: the best predictor from
        x_t alone; what the filter gains over it is the transport."""
        return sc.predict_from_x_only(batch.inputs.double() / self.noise, self.matrix(),
                                      sc.symbol_means() / self.noise)


@dataclass(frozen=True)
class Binding:
    """Associative recall: k_1 v_1 ... k_L v_L q_1 ... q_Q, keys distinct out of ``K``,
    values uniform out of ``V``, each query a key of the context; answer its value. Token
    ids: keys 0..K-1, values K..K+V-1; the targets are value indices 0..V-1."""

    K: int = 32
    V: int = 16
    L: int = 12
    Q: int = 8

    name = "binding"
    input = "tokens"

    def __post_init__(self):
        _check_settings(self, {"K": (1, 4096), "V": (2, 4096), "L": (1, self.K), "Q": (1, 4096)})

    @property
    def n_out(self) -> int:
        return self.V

    @property
    def vocab(self) -> int:
        return self.K + self.V

    @property
    def T(self) -> int:
        return 2 * self.L + self.Q

    def sample(self, n: int, rng: np.random.Generator) -> Batch:
        n = check_int("n", n, 1, None)
        rng = _check_rng(rng)
        keys = np.argsort(rng.random((n, self.K)), -1)[:, : self.L]  # distinct keys
        values = rng.integers(0, self.V, (n, self.L))
        asked = rng.integers(0, self.L, (n, self.Q))  # which pair each query asks for
        tokens = np.empty((n, self.T), dtype=np.int64)
        tokens[:, 0:2 * self.L:2], tokens[:, 1:2 * self.L:2] = keys, values + self.K
        tokens[:, 2 * self.L:] = np.take_along_axis(keys, asked, 1)
        targets = np.take_along_axis(values, asked, 1)
        return Batch(torch.as_tensor(tokens), torch.as_tensor(targets),
                     torch.arange(2 * self.L, self.T))

    def baseline_log_probs(self, batch: Batch) -> Tensor:
        """The reference point of the share of the attainable gain: uniform over the values."""
        return _uniform(batch, self.n_out)

    def bayes_log_probs(self, batch: Batch) -> Tensor:
        """The bound value with probability 1: log-probabilities 0 there, -inf elsewhere."""
        onehot = torch.nn.functional.one_hot(batch.targets, self.V).double()
        return torch.log(onehot)


PRIMITIVES = {"accumulation": Accumulation, "transport": Transport, "binding": Binding}


def make_task(name: str, **settings):
    """One of the three tasks by name, with its settings (validated by name)."""
    if name not in PRIMITIVES:
        raise ValueError(f"the primitive must be one of {list(PRIMITIVES)}, got {name!r}")
    return settings_from_dict(PRIMITIVES[name], settings, name)

