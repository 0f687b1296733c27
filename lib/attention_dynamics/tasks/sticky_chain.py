"""The sticky Markov chain of the paper's headline experiment (R7), drawn exactly as the
authors' script draws it (same generator calls, dtype and order, so that each seed gives
the script's own sequence), with its Bayes floors.

- 8 states on a circle; off-diagonal weight 1/d(i, j) with circular distance d. The
  authors' script sets the diagonal to 0.3, normalizes the row, scales it by 0.7, adds 0.3
  on the diagonal again and renormalizes, so the real self-transition is 0.3498, not 0.3.
  We reproduce that matrix (it is what the reported numbers come from).
- Symbol means mu_k in R^20 drawn N(0, I) once from a generator seeded 0.
- Per run: 2000 states, uniform start; x_t = mu_{y_{t-1}} + eps_t, eps_t ~ N(0, I);
  target y_t; 1999 positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..validation import check_float, check_int, check_int_list, check_tensor

__all__ = [
    "N_STATES",
    "D_X",
    "SEEDS",
    "transition_matrix",
    "symbol_means",
    "StickySequence",
    "sample_sequences",
    "conditional_entropy",
    "stationary_distribution",
    "predict_from_x_only",
    "forward_filter",
    "cross_entropy_of",
    "expected_floors",
    "predictor_loss",
    "predictor_accuracy",
    "generator_after",
]

N_STATES = 8
D_X = 20
SEEDS = (42, 2024, 1337, 7777, 9999)  # the authors' script's (reference.SCRIPT_R7, a test holds them equal)


def transition_matrix(n_states: int = N_STATES, self_weight: float = 0.3, *, quirk: bool = True,
                      dtype=torch.float64) -> Tensor:
    """The authors' transition matrix, computed as their script computes it (row by row, in
    float32: the row of weights 1/d with ``self_weight`` on the diagonal, normalized, scaled by
    1 - self_weight, ``self_weight`` added on the diagonal again, renormalized), then given in
    ``dtype``: the very matrix the sequences are drawn from. ``quirk=False`` gives the matrix
    the script meant (self-transition exactly ``self_weight``, the rest spread as 1/d), in
    float64 arithmetic."""
    n = check_int("n_states", n_states, 2, 1024)
    w = check_float("self_weight", self_weight, 0.0, 1.0, high_open=True)
    i = torch.arange(n)
    diff = (i[None, :] - i[:, None]).abs()
    d = torch.minimum(diff, n - diff).to(torch.float64)
    inverse = torch.where(d > 0, 1.0 / d.clamp_min(1), torch.zeros((), dtype=torch.float64))
    if not quirk:
        off = inverse / inverse.sum(1, keepdim=True)
        return ((1 - w) * off + w * torch.eye(n, dtype=torch.float64)).to(dtype)
    rows = []
    for r in range(n):
        diagonal = (i == r).float()
        row = torch.where(i == r, torch.tensor(w), inverse[r]).float()  # stored in float32
        row = row / row.sum() * (1 - w) + diagonal * w
        rows.append(row / row.sum())
    return torch.stack(rows).to(dtype)


def symbol_means(n_states: int = N_STATES, d_x: int = D_X, seed: int = 0, dtype=torch.float64) -> Tensor:
    """mu_k ~ N(0, I) drawn in float32 from a generator seeded ``seed`` (as the script draws
    them after ``torch.manual_seed(0)``), given in ``dtype``."""
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    return torch.randn(n_states, d_x, generator=g, dtype=torch.float32).to(dtype)


@dataclass(frozen=True)
class StickySequence:
    states: Tensor  # (R, T + 1) y_0 .. y_T
    x: Tensor  # (R, T, d_x): x_t = mu_{y_{t-1}} + eps_t, t = 1..T
    y: Tensor  # (R, T): targets y_t, t = 1..T

    @property
    def length(self) -> int:
        return self.y.shape[1]


def sample_sequences(seeds, *, seq_len: int = 2000, dtype=torch.float32) -> StickySequence:
    """One sequence of ``seq_len`` states per seed, stacked on a leading run dimension,
    drawn exactly as the authors' script draws it after ``torch.manual_seed(seed)``: from a
    generator seeded ``seed``, the start state (uniform), then each next state by one
    ``multinomial`` call on the float32 row of the current state, then the noise N(0, I) in
    float32; x_t = mu_{y_{t-1}} + eps_t in float32, given in ``dtype``. The held-out
    sequence of seed s is the sequence of seed s + 10000, as in the script's deep variant."""
    seeds = check_int_list("seeds", list(seeds), 0, None)
    L = check_int("seq_len", seq_len, 2, 10_000_000)
    drawn = [_draw(torch.Generator().manual_seed(s), L) for s in seeds]
    states = torch.stack([d[0] for d in drawn])
    x = torch.stack([d[1] for d in drawn])
    return StickySequence(states=states, x=x.to(dtype), y=states[:, 1:].clone())


def generator_after(seed: int, seq_len: int = 2000) -> torch.Generator:
    """A generator seeded ``seed`` that has drawn that seed's sequence: where the script's
    deep variant goes on to draw its model's initial weights (after the held-out sequence,
    seed + 10000)."""
    g = torch.Generator().manual_seed(check_int("seed", seed, 0, None))
    _draw(g, check_int("seq_len", seq_len, 2, 10_000_000))
    return g


def _draw(g: torch.Generator, L: int) -> tuple[Tensor, Tensor]:
    P = transition_matrix(dtype=torch.float32)
    means = symbol_means(dtype=torch.float32)
    seq = [int(torch.randint(N_STATES, (1,), generator=g))]
    for _ in range(L - 1):  # sequential: each draw depends on the last state
        seq.append(int(torch.multinomial(P[seq[-1]], 1, generator=g)))
    states = torch.tensor(seq)
    return states, means[states[:-1]] + torch.randn(L - 1, D_X, generator=g, dtype=torch.float32)


def stationary_distribution(A: Tensor) -> Tensor:
    evals, evecs = torch.linalg.eig(A.T)
    v = evecs[:, torch.argmin((evals - 1).abs())].real
    return v / v.sum()


def conditional_entropy(A: Tensor) -> float:
    """H(Y_t | Y_{t-1}) in nats under the stationary distribution: the script's
    "theoretical minimum", reachable only by a predictor that knows y_{t-1} exactly."""
    pi = stationary_distribution(A)
    logA = torch.log(torch.where(A > 0, A, torch.ones((), dtype=A.dtype)))
    return float(-(pi[:, None] * A * logA).sum())


def _emission_loglik(x: Tensor, means: Tensor) -> Tensor:
    """log N(x_t; mu_h, I) for every h: (..., T, n_states)."""
    check_tensor("x", x, min_ndim=2, nonempty=True)
    check_tensor("means", means, ndim=2, nonempty=True)
    if x.shape[-1] != means.shape[1]:
        raise ValueError(f"x has width {x.shape[-1]} but the symbol means have width {means.shape[1]}")
    x = x.to(means.dtype)
    d = means.shape[1]
    sq = ((x[..., None, :] - means) ** 2).sum(-1)
    return -0.5 * sq - 0.5 * d * math.log(2 * math.pi)


def predict_from_x_only(x: Tensor, A: Tensor, means: Tensor) -> Tensor:
    """log P(y_t | x_t) for the best predictor that sees only x_t (stationary prior on
    y_{t-1}): (..., T, n_states)."""
    pi = stationary_distribution(A)
    post = torch.softmax(_emission_loglik(x, means) + torch.log(pi), -1)  # P(y_{t-1} | x_t)
    return torch.log(post @ A)


def forward_filter(x: Tensor, A: Tensor, means: Tensor) -> Tensor:
    """log P(y_t | x_1..x_t), the Bayes-optimal causal predictor (an HMM forward filter
    whose hidden state at time t is y_{t-1}, emitting x_t): (..., T, n_states). The honest
    floor of chapter *The sticky Markov chain: beyond the protocol*."""
    e = _emission_loglik(x, means)
    T = e.shape[-2]
    log_belief = torch.log(stationary_distribution(A)).expand(e.shape[:-2] + (A.shape[0],))  # prior on y_0
    out = []
    logA = torch.log(A)
    for t in range(T):
        post = torch.log_softmax(log_belief + e[..., t, :], -1)  # P(y_{t-1} | x_1..x_t)
        pred = torch.logsumexp(post[..., :, None] + logA, -2)  # P(y_t | x_1..x_t)
        out.append(pred)
        log_belief = pred
    return torch.stack(out, -2)


def cross_entropy_of(log_pred: Tensor, y: Tensor) -> Tensor:
    """Mean over positions of -log P(y_t), per run: (...,)."""
    check_tensor("log_pred", log_pred, min_ndim=2, finite=False, nonempty=True)
    check_tensor("y", y, kind="int")
    if y.shape != log_pred.shape[:-1]:
        raise ValueError(f"y must have shape {tuple(log_pred.shape[:-1])}, got {tuple(y.shape)}")
    return -log_pred.gather(-1, y[..., None]).squeeze(-1).mean(-1)


def predictor_loss(predictor, seq: StickySequence, A: Tensor | None = None, means: Tensor | None = None) -> Tensor:
    """The cross-entropy (nats) on each of ``seq``'s sequences of a Bayes predictor,
    :func:`forward_filter` or :func:`predict_from_x_only`, computed in float64: (R,)."""
    A = transition_matrix() if A is None else A
    means = symbol_means() if means is None else means
    return cross_entropy_of(predictor(seq.x.double(), A, means), seq.y)


def predictor_accuracy(predictor, seq: StickySequence) -> Tensor:
    """How often a Bayes predictor's most probable next state is the true one, on each of
    ``seq``'s sequences: (R,)."""
    logp = predictor(seq.x.double(), transition_matrix(), symbol_means())
    return (logp.argmax(-1) == seq.y).double().mean(-1)


def expected_floors(n_sequences: int = 64, *, seed: int = 123456, seq_len: int = 2000) -> dict[str, float]:
    """The floors in nats, as expectations: exact for the uniform and H(Y|Y_prev)
    predictors, Monte Carlo over ``n_sequences`` fresh sequences for the x_t-only
    predictor and the forward filter (with their standard errors)."""
    A, means = transition_matrix(), symbol_means()
    seq = sample_sequences(range(seed, seed + check_int("n_sequences", n_sequences, 2, 100_000)),
                           seq_len=seq_len, dtype=torch.float64)
    x_only = cross_entropy_of(predict_from_x_only(seq.x, A, means), seq.y)
    filt = cross_entropy_of(forward_filter(seq.x, A, means), seq.y)
    n = len(x_only)
    return {
        "uniform": math.log(A.shape[0]),
        "conditional_entropy": conditional_entropy(A),
        "x_only": float(x_only.mean()), "x_only_se": float(x_only.std() / math.sqrt(n)),
        "filter": float(filt.mean()), "filter_se": float(filt.std() / math.sqrt(n)),
    }
