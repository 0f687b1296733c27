"""The bijection wind tunnel experiment (R8): its settings, its model and its training.

The task and its exact posterior are in :mod:`attention_dynamics.tasks.bijection`, the
measurements in :mod:`attention_dynamics.geometry` (calibration, geometry) and
:mod:`attention_dynamics.law_probe` (the laws inside the model). One
:class:`WindTunnelConfig` carries the settings the three wind-tunnel chapters share; it
builds the model (:mod:`attention_dynamics.transformer`) and trains it with
:func:`attention_dynamics.transformer.fit` on fresh samples every step.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from .tasks.bijection import EvalSet, WindTunnel, eval_set, sample_batch, supervised_positions
from .training import History
from .transformer import CausalTransformer, TransformerConfig, fit, log_probs_at
from .validation import check_bool, check_float, check_int

__all__ = ["WindTunnelConfig", "supervised_log_probs"]


@dataclass(frozen=True)
class WindTunnelConfig:
    """The settings of a wind-tunnel run, validated by name: alphabet ``V``, ``L`` pairs in
    context, the model (``d_model`` wide, ``n_layers`` layers of ``n_heads`` heads, feed-forward
    4 x d_model), ``n_steps`` AdamW steps on ``batch`` fresh sequences at rate ``lr`` (cosine
    decay to zero), ``seed`` for the weights and the data, ``eval_size`` held-out sequences;
    ``repeats``: the control variant of the task (keys drawn with replacement)."""

    V: int = 8
    L: int = 7
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_steps: int = 6000
    batch: int = 128
    lr: float = 3e-3
    seed: int = 0
    eval_size: int = 512
    repeats: bool = False  # keys drawn with replacement (the control variant of the task)

    def __post_init__(self):
        check_int("V", self.V, 2, 64)
        check_int("L", self.L, 1, self.V)
        check_int("d_model", self.d_model, 8, 1024)
        check_int("n_layers", self.n_layers, 1, 24)
        check_int("n_heads", self.n_heads, 1, self.d_model)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model = {self.d_model} must be a multiple of n_heads = {self.n_heads}")
        check_int("n_steps", self.n_steps, 10, 10_000_000)
        check_int("batch", self.batch, 1, 100_000)
        check_float("lr", self.lr, 0.0, 1.0, low_open=True)
        check_int("seed", self.seed, 0, 2**31 - 1)
        check_int("eval_size", self.eval_size, 16, 1_000_000)
        check_bool("repeats", self.repeats)

    @classmethod
    def from_dict(cls, settings: dict, name: str = "wind_tunnel") -> "WindTunnelConfig":
        """The settings given in ``settings`` (a chapter's ``wind_tunnel`` parameter), the
        defaults for the rest, validated."""
        if not isinstance(settings, dict):
            raise TypeError(f"{name} must be a mapping of settings, got {type(settings).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"{name} has no setting(s) {unknown}; its settings are {known}")
        return cls(**settings)

    @property
    def task(self) -> WindTunnel:
        return WindTunnel(self.V, self.L, repeats=self.repeats)

    def eval_set(self) -> EvalSet:
        """The held-out sequences every measurement uses (generator seed ``seed + 12345``)."""
        return eval_set(self.task, self.eval_size, seed=self.seed + 12345)

    def model(self) -> CausalTransformer:
        """A fresh model, initialized from torch's global generator seeded ``seed``."""
        torch.manual_seed(self.seed)
        cfg = TransformerConfig(n_out=self.V, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                                d_ff=4 * self.d_model, dropout=0.0, input="tokens", vocab=self.V,
                                max_len=self.task.length)
        return CausalTransformer(cfg)

    def train(self, model: CausalTransformer, *, callback=None, every: int = 100, rates: dict | None = None,
              frozen: tuple[str, ...] = (), progress: bool = True, desc: str = "wind tunnel") -> History:
        """Train on ``batch`` fresh sequences every step (generator seeded ``seed``).
        ``rates``: learning rate per role (default ``lr`` for all); ``frozen``: roles that
        do not train (the ablations)."""
        task = self.task
        gen = torch.Generator().manual_seed(self.seed)
        return fit(model, lambda: sample_batch(task, self.batch, gen), self.n_steps, lr=self.lr, rates=rates,
                   frozen=frozen, positions=supervised_positions(task), callback=callback, every=every,
                   progress=progress, desc=desc)


def supervised_log_probs(model: CausalTransformer, tokens: Tensor, task: WindTunnel, *, inspect: bool = False):
    """Log-probabilities at the supervised positions (B, L + 1, V), and the traces."""
    return log_probs_at(model, tokens, supervised_positions(task), inspect=inspect)
