"""The wind tunnel's ablations (chapter *The laws at work*): a run of
:class:`~attention_dynamics.windtunnel.WindTunnelConfig` with one channel of the gradient
laws switched off (:meth:`CausalTransformer.freeze_channel`), some roles frozen, or roles
at rates of their own, trained once and stored with the model's states every ``every``
steps, like the plain run (:meth:`WindTunnelConfig.trajectory`).

Stored, the ablations are models a build can train as tasks of their own, side by side or
on a cluster (:mod:`attention_dynamics.book.plans`), while the chapter measures them from
the store; trained inside the chapter, they made it the longest task of the book.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch

from .artifacts import load_or_make
from .training import ROLES, History, em_style_rates
from .transformer import CausalTransformer
from .validation import check_choice, check_float, check_int
from .windtunnel import WindTunnelConfig

__all__ = ["Ablation", "ablation_settings", "ablated"]

CHANNELS = ("pattern", "values")


def ablation_settings(cfg: WindTunnelConfig, em_slow_scale: float) -> dict[str, dict]:
    """The chapter's five ablations of ``cfg``, by name, as :func:`ablated`'s keyword
    arguments: each channel of the laws frozen at initialization; W_Q, W_K frozen; W_V
    frozen; every role but the values at ``em_slow_scale`` times the rate (the EM-style
    split of the paper's two timescales, applied to the whole model)."""
    if not isinstance(cfg, WindTunnelConfig):
        raise TypeError(f"cfg must be a WindTunnelConfig, got {type(cfg).__name__}")
    em_slow_scale = check_float("em_slow_scale", em_slow_scale, 0.0, 1.0, low_open=True, high_open=True)
    return {"values frozen": {"channel": "values"},
            "pattern frozen": {"channel": "pattern"},
            "W_Q, W_K frozen": {"frozen": ("routing",)},
            "W_V frozen": {"frozen": ("values",)},
            "all but values slow": {"rates": em_style_rates(cfg.lr * em_slow_scale, cfg.lr)}}


@dataclass(frozen=True)
class Ablation:
    """A stored ablated run (:func:`ablated`): the training loss at every step and the
    model's states at ``steps``; ``provenance`` says when and where it was trained, in how
    many seconds, and whether it was loaded."""

    config: WindTunnelConfig
    channel: str | None
    loss: np.ndarray
    steps: list[int]
    states: list[dict]
    provenance: dict

    def model_at(self, step: int) -> CausalTransformer:
        """The model after ``step`` updates (one of ``steps``), its channel frozen at
        initialization as in training; for measurements only: every parameter requires a
        gradient again, and the optimizer's state is not stored."""
        if step not in self.steps:
            raise ValueError(f"step must be one of the stored steps {self.steps}, got {step}")
        model = self.config.model()  # the initialization the frozen channel keeps
        if self.channel is not None:
            model.freeze_channel(self.channel)
        model.load_state_dict(self.states[self.steps.index(step)])
        return model

    def measured(self, measure: Callable[[int, CausalTransformer], Any]) -> History:
        """A :class:`History` whose checkpoints hold ``measure(step, model)`` at every
        stored step."""
        return History(self.loss, [(s, measure(s, self.model_at(s))) for s in self.steps])


def ablated(cfg: WindTunnelConfig, every: int, *, channel: str | None = None, frozen: tuple[str, ...] = (),
            rates: dict[str, float] | None = None, progress: bool = True, desc: str = "ablation") -> Ablation:
    """The run of ``cfg`` (:meth:`WindTunnelConfig.train`) with ``channel`` ("pattern" or
    "values") frozen at initialization, the roles in ``frozen`` not training and ``rates``
    (a rate per role), its model's states kept at steps 0, every, 2 every, ... and the last:
    loaded when an earlier call (in any process) stored it, else trained and stored.
    ``eval_size`` plays no part in training and none in the key."""
    if not isinstance(cfg, WindTunnelConfig):
        raise TypeError(f"cfg must be a WindTunnelConfig, got {type(cfg).__name__}")
    every = check_int("every", every, 1, cfg.n_steps)
    if channel is not None:
        check_choice("channel", channel, CHANNELS)
    if isinstance(frozen, str):
        raise TypeError(f"frozen must be a tuple of roles among {list(ROLES)}, got the string {frozen!r}")
    for role in frozen:
        check_choice("frozen", role, ROLES)
    frozen = tuple(r for r in ROLES if r in frozen)  # one key per set of roles
    for role, r in (rates or {}).items():
        check_choice("rates' role", role, ROLES)
        check_float(f"rates[{role!r}]", r, 0.0, 1.0, low_open=True)
    rates = {role: float(rates[role]) for role in ROLES if role in (rates or {})}
    settings = {k: v for k, v in asdict(cfg).items() if k != "eval_size"} | {
        "every": every, "channel": channel, "frozen": list(frozen), "rates": rates}

    def make() -> dict:
        model = cfg.model()
        if channel is not None:
            model.freeze_channel(channel)

        def keep(step, params, out):
            return {k: v.clone() for k, v in model.state_dict().items()}

        hist = cfg.train(model, callback=keep, every=every, rates=rates or None, frozen=frozen,
                         progress=progress, desc=desc)
        return {"loss": torch.as_tensor(hist.loss), "steps": [s for s, _ in hist.checkpoints],
                "states": [c for _, c in hist.checkpoints]}

    payload, provenance = load_or_make("windtunnel_ablation", settings, make, modules=[__name__])
    return Ablation(cfg, channel, payload["loss"].numpy(), payload["steps"], payload["states"], provenance)
