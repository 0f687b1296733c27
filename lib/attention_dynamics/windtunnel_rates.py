"""The wind tunnel trained with an optimizer and a rate per role, judged on held-out
sequences (R8 with R6's two timescales; chapter *Is it EM or the learning rate? The wind
tunnel*).

The paper's EM-style schedule slows the routing (W_Q, W_K) against the values. The wind
tunnel's ablation in *The laws at work* slowed every parameter but the values (embeddings,
MLP, read-out and LayerNorm too), so a worse calibration there may only say that most of
the model trained at a tenth of its rate. Here each *method* (:data:`METHODS`) names an
optimizer and the roles it slows; one :func:`train_run` trains one seed of
:class:`~attention_dynamics.windtunnel.WindTunnelConfig` with one method at one base rate
and takes, every ``eval_every`` steps, the KL divergence from the exact posterior to the
model on the held-out sequences (bits, the excess of the held-out cross-entropy over the
Bayes floor) and the mean absolute entropy error the other wind-tunnel chapters report.

A run is stored (:mod:`attention_dynamics.artifacts`) under its settings, so a chapter run
again after an edit of its text loads it, and runs asked for by several processes at once
are made once.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .artifacts import load_or_make
from .geometry import calibration_errors
from .tasks.bijection import sample_batch, supervised_positions
from .training import ROLES, StepOutput, TorchOptimizer, TrainingDiverged, train
from .transformer import evaluating, log_probs_at, make_optimizer
from .validation import check_float, check_int
from .windtunnel import WindTunnelConfig

__all__ = ["METHODS", "SLOW", "method_rates", "Run", "train_run"]

# method -> (optimizer, the roles trained at ``slow`` times the base rate)
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "AdamW": ("adamw", ()),
    "EM-style": ("adamw", ("routing",)),  # the routing slow, as the name says: W_Q, W_K
    "SGD": ("sgd", ()),
    "all but values slow": ("adamw", ("routing", "other")),  # the ablation of *The laws at work*
}
SLOW = 0.1  # the paper's ratio of 10 between the values' rate and the routing's


def method_rates(method: str, lr: float, slow: float = SLOW) -> dict[str, float]:
    """The rate of each role: ``slow * lr`` for the method's slow roles, ``lr`` for the rest."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    lr = check_float("lr", lr, 0.0, 1e3, low_open=True)
    slow = check_float("slow", slow, 0.0, 1.0, low_open=True)
    return {role: lr * slow if role in METHODS[method][1] else lr for role in ROLES}


@dataclass(frozen=True)
class Run:
    """One seed of the wind tunnel trained with ``method`` at base rate ``lr``: the training
    loss at every step (nats, on that step's fresh batch), and at ``eval_steps`` the KL from
    the exact posterior to the model on the held-out sequences by supervised position
    (``kl_by_position``, bits, the last position is the query) and the mean |entropy error|
    (bits). A run that diverged has ``diverged_at`` (the step) and the cause, and infinite
    curves from its first evaluation after it."""

    method: str
    lr: float
    seed: int
    train_loss: np.ndarray
    eval_steps: np.ndarray
    kl_by_position: np.ndarray  # (len(eval_steps), L + 1)
    mae_bits: np.ndarray
    diverged_at: int | None
    cause: str | None
    provenance: dict

    @property
    def kl_bits(self) -> np.ndarray:
        """The held-out KL averaged over the supervised positions, at ``eval_steps``."""
        return self.kl_by_position.mean(1)


def _optimizer(model, method: str, lr: float, slow: float) -> torch.optim.Optimizer:
    """AdamW as the wind-tunnel chapters train (:func:`transformer.make_optimizer`), or plain
    SGD over the same groups, each role at its rate."""
    adamw = make_optimizer(model, lr=lr, rates=method_rates(method, lr, slow))
    if METHODS[method][0] == "adamw":
        return adamw
    return torch.optim.SGD([{"params": g["params"], "lr": g["lr"]} for g in adamw.param_groups], lr=lr)


def _train(cfg: WindTunnelConfig, method: str, lr: float, slow: float, eval_every: int, max_loss: float,
           progress: bool) -> dict:
    """The payload :func:`train_run` stores: the loss curve, or the step and cause of the
    divergence, and the held-out curves (each row: KL per position, then the mean |entropy
    error|) as far as the run got."""
    task, ev, model = cfg.task, cfg.eval_set(), cfg.model()
    positions = supervised_positions(task)
    opt = _optimizer(model, method, lr, slow)
    gen = torch.Generator().manual_seed(cfg.seed)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    curves = []  # kept as they come, so a run that diverges keeps what it had

    def loss_fn(p):
        # transformer.fit's step with another optimizer: fit builds AdamW itself, and a
        # change to it would change the key of every stored wind-tunnel model
        inputs, targets = sample_batch(task, cfg.batch, gen)
        opt.zero_grad()
        logp, _ = log_probs_at(model, inputs, positions)
        loss = torch.nn.functional.nll_loss(logp.reshape(-1, logp.shape[-1]), targets.reshape(-1))
        loss.backward()
        return StepOutput(loss.detach(), {n: t.grad for n, t in trainable.items() if t.grad is not None})

    def held_out(step, params, out):
        with evaluating(model):
            logp, _ = log_probs_at(model, ev.tokens, positions)
        err = calibration_errors(logp, ev.bayes_bits, ev.posterior)
        curves.append(torch.cat([err["kl_bits"], err["mae"].reshape(1)]))

    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.n_steps)
    done = {}
    try:
        h = train(trainable, loss_fn, TorchOptimizer(opt, scheduler=sched), cfg.n_steps, callback=held_out,
                  every=eval_every, max_loss=max_loss, progress=progress, desc=f"{method} at {lr:g}")
        done["loss"] = torch.as_tensor(h.loss)
    except TrainingDiverged as e:
        done.update(diverged_at=e.step, cause=e.cause)
    return done | {"curves": torch.stack(curves).to(torch.float64)}


def train_run(cfg: WindTunnelConfig, method: str, lr: float, *, eval_every: int, slow: float = SLOW,
              max_loss: float = 20.0, progress: bool = False) -> Run:
    """Train seed ``cfg.seed`` of ``cfg`` with ``method`` at base rate ``lr`` (cosine decay to
    zero over ``cfg.n_steps``, as the other wind-tunnel chapters), the held-out curves every
    ``eval_every`` steps on ``cfg.eval_set()``. A training loss above ``max_loss`` nats (ln V
    is the uniform guess) or a non-finite loss, gradient or weight stops the run as diverged.
    Loaded if stored, else trained and stored."""
    if not isinstance(cfg, WindTunnelConfig):
        raise TypeError(f"cfg must be a WindTunnelConfig, got {type(cfg).__name__}")
    method_rates(method, lr, slow)  # validates method, lr and slow
    eval_every = check_int("eval_every", eval_every, 1, cfg.n_steps)
    max_loss = check_float("max_loss", max_loss, 0.0, None, low_open=True)
    # cfg.lr plays no part: the base rate is lr
    settings = {k: v for k, v in asdict(cfg).items() if k != "lr"} | {
        "method": method, "lr": float(lr), "slow": float(slow), "eval_every": eval_every, "max_loss": max_loss}
    steps = sorted(set(range(0, cfg.n_steps + 1, eval_every)) | {cfg.n_steps})

    payload, provenance = load_or_make("windtunnel_rates", settings,
                                       lambda: _train(cfg, method, lr, slow, eval_every, max_loss, progress),
                                       modules=[__name__])
    curves = np.full((len(steps), len(supervised_positions(cfg.task)) + 1), np.inf)
    curves[:len(payload["curves"])] = payload["curves"].numpy()
    if "diverged_at" in payload:
        loss = np.full(cfg.n_steps + 1, np.inf)
        return Run(method, float(lr), cfg.seed, loss, np.array(steps), curves[:, :-1], curves[:, -1],
                   int(payload["diverged_at"]), str(payload["cause"]), provenance)
    return Run(method, float(lr), cfg.seed, payload["loss"].numpy(), np.array(steps), curves[:, :-1], curves[:, -1],
               None, None, provenance)

