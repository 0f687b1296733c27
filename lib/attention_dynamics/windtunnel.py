"""The bijection wind tunnel experiment (R8): its settings, its model and its training.

The task and its exact posterior are in :mod:`attention_dynamics.tasks.bijection`, the
measurements in :mod:`attention_dynamics.geometry` (calibration, geometry) and
:mod:`attention_dynamics.law_probe` (the laws inside the model). One
:class:`WindTunnelConfig` carries the settings the three wind-tunnel chapters share; it
builds the model (:mod:`attention_dynamics.transformer`) and trains it with
:func:`attention_dynamics.transformer.fit` on fresh samples every step.

A plain run (no ablation) is asked for as a :class:`Trajectory`: the model's and the
optimizer's states every ``every`` steps, trained once and stored
(:mod:`attention_dynamics.artifacts`), so that the three chapters that measure the same
baseline share one training run.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from .artifacts import load_or_make
from .tasks.bijection import EvalSet, WindTunnel, eval_set, sample_batch, supervised_positions
from .training import History
from .transformer import CausalTransformer, TransformerConfig, fit, log_probs_at, make_optimizer
from .validation import check_bool, check_float, check_int, settings_from_dict

__all__ = ["WindTunnelConfig", "Trajectory", "supervised_log_probs"]


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
        return settings_from_dict(cls, settings, name)

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


    def trajectory(self, every: int, *, progress: bool = True, desc: str = "wind tunnel") -> "Trajectory":
        """The plain training run of these settings with the model's and optimizer's states
        at steps 0, every, 2 every, ... and the last: loaded when an earlier call (in any
        process) stored it, else trained (:meth:`train`) and stored. ``eval_size`` plays no
        part in training and none in the key."""
        every = check_int("every", every, 1, self.n_steps)
        settings = {k: v for k, v in asdict(self).items() if k != "eval_size"} | {"every": every}

        def make() -> dict:
            model = self.model()

            def keep(step, params, out):
                return {"model": {k: v.clone() for k, v in model.state_dict().items()},
                        "optimizer": copy.deepcopy(out.info["optimizer"].state_dict())}

            hist = self.train(model, callback=keep, every=every, progress=progress, desc=desc)
            return {"loss": torch.as_tensor(hist.loss), "steps": [s for s, _ in hist.checkpoints],
                    "states": [c for _, c in hist.checkpoints]}

        payload, provenance = load_or_make("windtunnel", settings, make, modules=[__name__])
        return Trajectory(self, payload["loss"].numpy(), payload["steps"], payload["states"], provenance)


@dataclass(frozen=True)
class Trajectory:
    """A stored plain training run (:meth:`WindTunnelConfig.trajectory`): the loss at every
    step, and the model's and the optimizer's states at ``steps``. ``provenance`` says when
    and where it was trained, in how many seconds, and whether it was loaded."""

    config: WindTunnelConfig
    loss: np.ndarray
    steps: list[int]
    states: list[dict]
    provenance: dict

    def model_at(self, step: int) -> CausalTransformer:
        """The model after ``step`` updates (one of ``steps``), in training mode."""
        if step not in self.steps:
            raise ValueError(f"step must be one of the stored steps {self.steps[0]}, {self.steps[1]}, ... "
                             f"{self.steps[-1]}, got {step}")
        model = self.config.model()
        model.load_state_dict(self.states[self.steps.index(step)]["model"])
        return model

    def replay(self, measure: Callable[[int, CausalTransformer, torch.optim.AdamW], Any]) -> History:
        """A :class:`History` of the run whose checkpoints hold ``measure(step, model,
        optimizer)`` at every stored step: the model and its optimizer as training left them
        there (the optimizer at that step's learning rate), as a ``fit`` callback sees them."""
        checkpoints = []
        for step, state in zip(self.steps, self.states):
            model = self.model_at(step)
            optimizer = make_optimizer(model, lr=self.config.lr)
            optimizer.load_state_dict(state["optimizer"])
            checkpoints.append((step, measure(step, model, optimizer)))
        return History(self.loss, checkpoints)


def supervised_log_probs(model: CausalTransformer, tokens: Tensor, task: WindTunnel, *, inspect: bool = False):
    """Log-probabilities at the supervised positions (B, L + 1, V), and the traces."""
    return log_probs_at(model, tokens, supervised_positions(task), inspect=inspect)
