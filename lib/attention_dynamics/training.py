"""One training loop with pluggable update rules.

A *loss function* maps the parameters (a dict of tensors) to a :class:`StepOutput`: the
loss (a scalar, or one value per independent run stacked on a leading dimension), the
gradients (closed form or autograd) and any extra information an update rule or a probe
needs. An *update rule* changes the parameters in place from the gradients. The loop
evaluates, calls a checkpoint callback, checks for divergence and steps:

    history = train(params, loss_fn, SGD(0.01), n_steps=1000)

Rules: :class:`SGD` (one learning rate, or one per parameter), :class:`PrototypeMStep`
(values jump by the closed-form 1/N_j step of R6), :class:`NormalizedValueStep`,
:class:`TorchOptimizer` (any ``torch.optim`` optimizer, for the transformer).

**Roles.** Every parameter has one of three roles, the same words for a single head and
for the transformer (:meth:`attention_dynamics.transformer.CausalTransformer.parameter_roles`): ``routing``
(the query and key maps, which decide the attention weights: the E-step), ``values`` (the
value maps: the M-step) and ``other`` (the read-out and everything else). The EM-style
schedule of the paper (R6, R7) is :func:`em_style_rates`: the values at a fast rate, every other
parameter at a slow one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np
import torch
from torch import Tensor

from .validation import NonFiniteError, check_float, check_int

__all__ = [
    "StepOutput",
    "TrainingDiverged",
    "UpdateRule",
    "SGD",
    "ROLES",
    "HEAD_ROLES",
    "em_style_rates",
    "head_rates",
    "PrototypeMStep",
    "NormalizedValueStep",
    "TorchOptimizer",
    "History",
    "train",
]

ROLES = ("routing", "values", "other")
HEAD_ROLES = {"W_Q": "routing", "W_K": "routing", "W_V": "values", "W_O": "other"}  # a single head's parameters


@dataclass
class StepOutput:
    loss: Tensor  # scalar, or (R,) for R independent runs
    grads: dict[str, Tensor]
    info: dict[str, Any] = field(default_factory=dict)


class TrainingDiverged(RuntimeError):
    """Training stopped: ``step`` is the step whose evaluation failed, ``cause`` says why."""

    def __init__(self, step: int, cause: str, run: int | None = None):
        where = f" (run {run})" if run is not None else ""
        super().__init__(f"training diverged at step {step}{where}: {cause}")
        self.step, self.cause, self.run = step, cause, run


class UpdateRule(Protocol):
    def __call__(self, params: dict[str, Tensor], out: StepOutput, step: int) -> None: ...


class SGD:
    """p <- p - lr_p * dL/dp. ``lr``: one rate for every parameter, or a dict by name
    (every parameter that receives a gradient must be named). A rate may be a tensor of
    shape (R,) to give each of R batched runs its own rate."""

    def __init__(self, lr: float | Mapping[str, float | Tensor]):
        if isinstance(lr, Mapping):
            self.lr = {}
            for k, v in lr.items():
                if isinstance(v, Tensor):
                    if not bool((v > 0).all() and torch.isfinite(v).all()):
                        raise ValueError(f"lr[{k!r}] must be positive and finite, got {v}")
                    self.lr[k] = v
                else:
                    self.lr[k] = check_float(f"lr[{k!r}]", v, 0.0, None, low_open=True)
        else:
            self.lr = check_float("lr", lr, 0.0, None, low_open=True)

    def rate(self, name: str, p: Tensor):
        if isinstance(self.lr, float):
            return self.lr
        if name not in self.lr:
            raise KeyError(f"no learning rate for parameter {name!r}; rates are given for {sorted(self.lr)}")
        r = self.lr[name]
        return r.reshape(-1, *([1] * (p.dim() - 1))) if isinstance(r, Tensor) else r

    def __call__(self, params, out, step):
        with torch.no_grad():
            for name, g in out.grads.items():
                params[name].sub_(self.rate(name, params[name]) * g)


def em_style_rates(slow_lr, value_lr) -> dict[str, float]:
    """The EM-style schedule of the paper (R6, R7), as a learning rate per role: the values
    at ``value_lr`` (the M-step, fast), the routing and every other parameter at
    ``slow_lr`` (the authors' script updates W_Q, W_K and the read-out W_O at the slow rate).
    Plain SGD is ``em_style_rates(lr, lr)``. Rates may be tensors of shape (R,), one per batched
    run. Chapters *Attention as a two-timescale EM algorithm* and *The sticky Markov chain*."""
    return {"routing": slow_lr, "values": value_lr, "other": slow_lr}


def head_rates(rates_by_role: Mapping[str, float | Tensor]) -> dict[str, float | Tensor]:
    """Rates by role -> rates by the parameter names of a single head (W_Q, W_K, W_V, W_O),
    for :class:`SGD`."""
    missing = [r for r in ROLES if r not in rates_by_role]
    if missing:
        raise ValueError(f"rates_by_role must give a rate for every role {list(ROLES)}; missing {missing}")
    return {name: rates_by_role[role] for name, role in HEAD_ROLES.items()}


class PrototypeMStep:
    """The closed-form prototype M-step of R6 for values that are free per-slot
    parameters: v_j <- v_j - damping * dL/dv_j / N_j, with N_j = sum_i alpha_ij taken from
    ``out.info['responsibility']`` (shaped like the value parameter without its last
    axis). With damping 1 and a squared-error read-out under hard attention this lands on
    the responsibility-weighted mean of the users' targets. Every other parameter takes
    plain SGD at ``lr``."""

    def __init__(self, lr: float | Mapping[str, float], *, value: str = "W_V", damping: float = 1.0,
                 min_responsibility: float = 1e-6):
        self.other = SGD(lr)
        self.value = value
        self.damping = check_float("damping", damping, 0.0, None, low_open=True)
        self.min_responsibility = check_float("min_responsibility", min_responsibility, 0.0, None, low_open=True)

    def __call__(self, params, out, step):
        if "responsibility" not in out.info:
            raise KeyError("PrototypeMStep needs out.info['responsibility'] (N_j for every value slot)")
        N = out.info["responsibility"]
        v = params[self.value]
        if N.shape != v.shape[:-1]:
            raise ValueError(f"responsibility has shape {tuple(N.shape)}; the value parameter needs {tuple(v.shape[:-1])}")
        with torch.no_grad():
            # A slot nobody uses has no M-step; it stays where it is.
            scale = torch.where(N > self.min_responsibility, self.damping / N.clamp_min(self.min_responsibility), 0.0)
            v.sub_(scale.unsqueeze(-1) * out.grads[self.value])
            rest = StepOutput(out.loss, {n: g for n, g in out.grads.items() if n != self.value}, out.info)
            self.other(params, rest, step)


class NormalizedValueStep:
    """The prototype M-step carried to values computed from inputs, v_j = x_j W_V:
    every value's gradient is divided by its share of responsibility, N_j / mean(N) (the
    1/N_j of R6, normalized so that an average value keeps the plain rate), floored at
    ``min_share`` so that keys almost nobody reads do not take huge steps; the result is
    mapped to W_V through the inputs like a gradient (W_V <- W_V - lr X^T dV'). Needs
    ``out.info['dV']`` (R, T, d_v) and ``out.info['N']`` (R, T) and the inputs x (R, T, d_x).
    Every other parameter takes plain SGD."""

    def __init__(self, lr: float | Mapping[str, float | Tensor], x: Tensor, *, value: str = "W_V", min_share: float = 0.1):
        self.sgd = SGD(lr)
        self.x, self.value = x, value
        self.min_share = check_float("min_share", min_share, 0.0, None, low_open=True)

    def __call__(self, params, out, step):
        for key in ("dV", "N"):
            if key not in out.info:
                raise KeyError(f"NormalizedValueStep needs out.info[{key!r}] (use value_info=True)")
        N = out.info["N"]
        share = (N / N.mean(-1, keepdim=True)).clamp_min(self.min_share)
        grad_v = self.x.transpose(-1, -2) @ (out.info["dV"] / share[..., None])
        self.sgd(params, StepOutput(out.loss, {**out.grads, self.value: grad_v}, out.info), step)


class TorchOptimizer:
    """Wraps a torch.optim optimizer (gradients already in ``.grad``), with optional
    gradient-norm clipping (over ``clip_params`` in their order, by default the
    optimizer's) and a learning-rate scheduler stepped after each update."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, scheduler=None, clip_norm: float | None = None,
                 clip_params: list[Tensor] | None = None):
        self.optimizer, self.scheduler = optimizer, scheduler
        self.clip_norm = None if clip_norm is None else check_float("clip_norm", clip_norm, 0.0, None, low_open=True)
        self.clip_params = clip_params or [p for group in optimizer.param_groups for p in group["params"]]

    def __call__(self, params, out, step):
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.clip_params, self.clip_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()


@dataclass
class History:
    loss: np.ndarray  # (n_steps + 1,) or (n_steps + 1, R): loss before each update, and after the last
    checkpoints: list[tuple[int, Any]]  # (step, whatever the callback returned) at every ``every`` steps

    def series(self, key: str) -> tuple[np.ndarray, list]:
        """Steps and values of one key of dict-valued checkpoints (those that have it)."""
        steps = np.array([s for s, c in self.checkpoints if key in c])
        return steps, [c[key] for s, c in self.checkpoints if key in c]

    @property
    def steps(self) -> np.ndarray:
        """The steps of all checkpoints."""
        return np.array([s for s, _ in self.checkpoints])

    def last(self):
        """What the callback returned at the last checkpoint."""
        return self.checkpoints[-1][1]


def _check_finite(step: int, out: StepOutput, max_loss: float | None) -> None:
    loss = out.loss.detach()
    flat = loss.reshape(-1)
    bad = ~torch.isfinite(flat)
    if bool(bad.any()):
        run = int(bad.nonzero()[0]) if flat.numel() > 1 else None
        raise TrainingDiverged(step, f"the loss is {float(flat[run or 0])}", run)
    if max_loss is not None and bool((flat > max_loss).any()):
        run = int((flat > max_loss).nonzero()[0]) if flat.numel() > 1 else None
        raise TrainingDiverged(step, f"the loss {float(flat[run or 0]):.4g} exceeded max_loss = {max_loss:g}", run)
    for name, g in out.grads.items():
        if not bool(torch.isfinite(g).all()):
            raise TrainingDiverged(step, f"the gradient of {name} is not finite")


def _check_parameters(step: int, params: dict[str, Tensor]) -> None:
    for name, p in params.items():
        if p.dtype.is_floating_point and not bool(torch.isfinite(p).all()):
            raise TrainingDiverged(step, f"the update of step {step} made {name} non-finite")


def train(params: dict[str, Tensor], loss_fn: Callable[[dict[str, Tensor]], StepOutput], rule: UpdateRule,
          n_steps: int, *, callback: Callable[[int, dict[str, Tensor], StepOutput], Any] | None = None,
          every: int = 1, max_loss: float | None = None, progress: bool = False, desc: str = "training") -> History:
    """Evaluate, record, update, ``n_steps`` times, then evaluate once more.

    The loss at index t of the history is the loss of the parameters after t updates.
    ``callback(step, params, out)`` is called at steps 0, every, 2*every, ... and at the
    last step. Raises :class:`TrainingDiverged` with the step and the cause when a loss,
    gradient or parameter stops being finite, when the loss function meets an overflow
    (:class:`~attention_dynamics.validation.NonFiniteError`) after the first update, or when
    the loss exceeds ``max_loss``. At step 0 such an error is the caller's input and is
    raised unchanged.
    """
    n_steps = check_int("n_steps", n_steps, 0, None)
    every = check_int("every", every, 1, None)
    if max_loss is not None:
        max_loss = check_float("max_loss", max_loss, 0.0, None, low_open=True)
    losses, checkpoints = [], []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_steps, desc=desc, leave=False, mininterval=2.0)
    try:
        for step in range(n_steps + 1):
            try:
                out = loss_fn(params)
            except NonFiniteError as e:
                if step == 0:
                    raise
                raise TrainingDiverged(step, f"the loss function met non-finite values ({e})") from None
            if not isinstance(out, StepOutput):
                raise TypeError(f"loss_fn must return a StepOutput, got {type(out).__name__}")
            _check_finite(step, out, max_loss)
            losses.append(out.loss.detach().cpu().numpy().copy())
            if callback is not None and (step % every == 0 or step == n_steps):
                checkpoints.append((step, callback(step, params, out)))
            if step == n_steps:
                break
            rule(params, out, step)
            _check_parameters(step, params)
            if bar is not None:
                bar.update(1)
                if step % 50 == 0:
                    bar.set_postfix(loss=f"{float(np.mean(losses[-1])):.4f}")
    finally:
        if bar is not None:
            bar.close()
    return History(np.stack(losses), checkpoints)
