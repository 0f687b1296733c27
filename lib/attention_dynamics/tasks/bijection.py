"""The bijection-elimination wind tunnel of Paper I (R8): a task whose exact posterior is
known at every supervised position.

Each sample draws a fresh random bijection pi on V symbols and L distinct keys (L <= V).
The sequence is [k_1, pi(k_1), ..., k_L, pi(k_L), q] with q one of the context keys; keys
and values share one alphabet of V symbols. The model predicts the next token, and we
supervise the L value tokens and the answer pi(q) after the query:

- at the value of pair i (0-indexed), the answer is uniform over the V - i values not yet
  seen: posterior entropy log2(V - i) bits;
- after the query the answer is certain: 0 bits.

In this task the posterior entropy is a function of the position alone. The variant with
``repeats=True`` draws the keys with replacement: a key seen before makes its value certain
(0 bits), a new key leaves V - (distinct values seen) candidates, so that entropy and
position part ways (the control of the value-manifold measurement, chapter *Geometry over
training*).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..validation import check_int, check_tensor

__all__ = ["WindTunnel", "bayes_entropy_bits", "posterior", "sample_batch", "supervised_positions", "EvalSet",
           "eval_set", "posterior_entropy_bits"]


@dataclass(frozen=True)
class WindTunnel:
    V: int  # alphabet size
    L: int  # pairs in context
    repeats: bool = False  # keys drawn with replacement (the control variant)

    def __post_init__(self):
        check_int("V", self.V, 2, 4096)
        check_int("L", self.L, 1, 4096 if self.repeats else self.V)

    @property
    def length(self) -> int:
        """Tokens per sequence: L pairs and the query."""
        return 2 * self.L + 1


def supervised_positions(task: WindTunnel) -> Tensor:
    """Positions whose next token is supervised: each key (its value follows) and the query."""
    return torch.cat([torch.arange(0, 2 * task.L, 2), torch.tensor([2 * task.L])])


def bayes_entropy_bits(task: WindTunnel) -> Tensor:
    """Exact posterior entropy in bits at each supervised position: log2(V - i), then 0.
    (With repeats the entropy depends on the sample: see :func:`posterior_entropy_bits`.)"""
    if task.repeats:
        raise ValueError("with repeats the posterior entropy depends on the sample; use posterior_entropy_bits")
    return torch.tensor([math.log2(task.V - i) for i in range(task.L)] + [0.0], dtype=torch.float64)


def posterior(tokens: Tensor, task: WindTunnel) -> Tensor:
    """The exact posterior over the next token at every supervised position: (B, L + 1, V)
    (chapter *Calibration: the model against the exact posterior*).
    At a value position: uniform over values not yet seen; after the query: one-hot."""
    check_tensor("tokens", tokens, ndim=2, kind="int", nonempty=True)
    if tokens.shape[1] != task.length:
        raise ValueError(f"tokens must have {task.length} columns (2L + 1 for L = {task.L}), got shape {tuple(tokens.shape)}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= task.V:
        raise ValueError(f"tokens must lie in [0, {task.V - 1}]")
    B = tokens.shape[0]
    V, L = task.V, task.L
    post = torch.zeros(B, L + 1, V, dtype=torch.float64)
    seen = torch.zeros(B, V, dtype=torch.bool)  # values shown so far
    rows = torch.arange(B)
    keys, vals = tokens[:, 0:2 * L:2], tokens[:, 1:2 * L:2]
    for i in range(L):
        free = ~seen
        post[:, i] = free.double() / free.sum(1, keepdim=True)
        if task.repeats:  # a key shown before: its value is known
            before = keys[:, :i] == keys[:, i:i + 1]
            known = before.any(1)
            if bool(known.any()):
                value = vals[rows, before.double().argmax(1)]
                post[known, i] = 0.0
                post[rows[known], i, value[known]] = 1.0
        seen[rows, vals[:, i]] = True
    q = tokens[:, 2 * L]
    answer = vals[rows, (keys == q[:, None]).double().argmax(1)]  # the first pair holding the query's key
    post[rows, L, answer] = 1.0
    return post


def posterior_entropy_bits(post: Tensor) -> Tensor:
    """Entropy in bits of each exact posterior (..., V)."""
    logp = torch.where(post > 0, post.log(), torch.zeros((), dtype=post.dtype))
    return -(post * logp).sum(-1) / math.log(2)


def sample_batch(task: WindTunnel, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch`` fresh samples: tokens (B, 2L + 1) and the targets (B, L + 1) at the
    supervised positions. Vectorized: permutations come from argsort of uniform noise."""
    B = check_int("batch", batch, 1, 10_000_000)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (seeded, for reproducible samples), got {type(generator).__name__}")
    V, L = task.V, task.L
    pi = torch.rand(B, V, generator=generator).argsort(1)  # a random bijection per sample
    if task.repeats:
        keys = torch.randint(0, V, (B, L), generator=generator)  # with replacement
    else:
        keys = torch.rand(B, V, generator=generator).argsort(1)[:, :L]  # L distinct keys
    vals = pi.gather(1, keys)
    q_idx = torch.randint(0, L, (B,), generator=generator)
    q = keys.gather(1, q_idx[:, None])
    tokens = torch.empty(B, 2 * L + 1, dtype=torch.long)
    tokens[:, 0:2 * L:2] = keys
    tokens[:, 1:2 * L:2] = vals
    tokens[:, 2 * L] = q[:, 0]
    targets = torch.cat([vals, vals.gather(1, q_idx[:, None])], 1)
    return tokens, targets


@dataclass(frozen=True)
class EvalSet:
    """Held-out sequences with their exact posterior, the same for every checkpoint."""

    tokens: Tensor
    targets: Tensor
    posterior: Tensor
    bayes_bits: Tensor  # (L + 1,) the Bayes entropy by position; (B, L + 1) per sample with repeats
    pos_bits: Tensor  # (B, L + 1) the Bayes entropy of each supervised position (for correlations)


def eval_set(task: WindTunnel, n: int = 512, seed: int = 12345) -> EvalSet:
    """``n`` sequences drawn from a generator seeded ``seed``, their targets, exact
    posteriors (B, L + 1, V) and the Bayes entropy of each supervised position."""
    check_int("n", n, 1, 10_000_000)
    gen = torch.Generator().manual_seed(seed)
    tokens, targets = sample_batch(task, n, gen)
    post = posterior(tokens, task)
    if task.repeats:
        bits = posterior_entropy_bits(post)  # per sample and position
        return EvalSet(tokens, targets, post, bits, bits)
    bits = bayes_entropy_bits(task)
    return EvalSet(tokens, targets, post, bits, bits[None].expand(n, -1))
