"""The inference-primitives experiment (R9): a small attention model and a small selective-SSM
model of matched size, trained on each primitive (:mod:`attention_dynamics.tasks.primitives`)
with the one ``fit``; each model's gap to the Bayes floor; and the routing law measured
inside both (chapters *One routing law for attention and selective SSMs* and *Three
inference primitives*). The routing law inside the trained models is measured by
:mod:`attention_dynamics.routing_probe`.

Both architectures see the same batches (drawn from ``numpy.random.default_rng(seed)``) and
are tested on the same held-out sequences. Trained models are stored
(:mod:`attention_dynamics.artifacts`), so the two chapters share them.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor, nn

from .artifacts import load_or_make
from .ssm import SSMConfig, SSMModel
from .tasks.primitives import Batch, make_task
from .transformer import CausalTransformer, TransformerConfig, evaluating, fit, log_probs_at
from .validation import check_choice, check_float, check_int, settings_from_dict

__all__ = ["ARCHITECTURES", "PrimitivesConfig", "build_model", "count_parameters", "trained", "floor_gap",
           "TrainedModel", "eval_batch"]

ARCHITECTURES = ("attention", "ssm")
EVAL_SEED, PROBE_SEED = 1_000_003, 777


@dataclass(frozen=True)
class PrimitivesConfig:
    """Model and training settings shared by both architectures: width ``d_model``, depth
    ``n_layers`` (attention: ``n_heads`` heads and a feed-forward 2 x d_model wide; SSM:
    2 x d_model channels of ``d_state`` states), ``n_steps`` AdamW steps on ``batch`` fresh
    sequences at rate ``lr`` (cosine to zero), ``eval_size`` held-out sequences."""

    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_state: int = 8
    n_steps: int = 1500
    batch: int = 64
    lr: float = 3e-3
    eval_size: int = 512

    def __post_init__(self):
        check_int("d_model", self.d_model, 4, 1024)
        check_int("n_layers", self.n_layers, 1, 16)
        check_int("n_heads", self.n_heads, 1, self.d_model)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model = {self.d_model} must be a multiple of n_heads = {self.n_heads}")
        check_int("d_state", self.d_state, 1, 256)
        check_int("n_steps", self.n_steps, 1, 10_000_000)
        check_int("batch", self.batch, 1, 100_000)
        check_float("lr", self.lr, 0.0, 1.0, low_open=True)
        check_int("eval_size", self.eval_size, 2, 1_000_000)

    @classmethod
    def from_dict(cls, settings: dict, name: str = "setup") -> "PrimitivesConfig":
        """The settings given (a chapter's ``setup`` parameter), the defaults for the rest."""
        return settings_from_dict(cls, settings, name)


def build_model(arch: str, task, cfg: PrimitivesConfig, seed: int) -> nn.Module:
    """A fresh model for ``task`` (initialized from torch's generator seeded ``seed``)."""
    check_choice("arch", arch, ARCHITECTURES)
    io = {"input": task.input, "d_in": getattr(task, "d_in", None), "vocab": getattr(task, "vocab", None)}
    torch.manual_seed(seed)
    if arch == "attention":
        return CausalTransformer(TransformerConfig(n_out=task.n_out, d_model=cfg.d_model, n_layers=cfg.n_layers,
                                                   n_heads=cfg.n_heads, d_ff=2 * cfg.d_model, max_len=task.T, **io))
    return SSMModel(SSMConfig(n_out=task.n_out, d_model=cfg.d_model, n_layers=cfg.n_layers, d_state=cfg.d_state,
                              **io))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class TrainedModel:
    arch: str
    task: object
    seed: int
    model: nn.Module
    loss: np.ndarray  # training loss at every step
    seconds: float  # training time (when it was trained)
    provenance: dict


def trained(arch: str, task_name: str, seed: int, cfg: PrimitivesConfig, *, task_settings: dict | None = None,
            progress: bool = True) -> TrainedModel:
    """The model of ``arch`` trained on the primitive ``task_name`` with ``seed`` (its
    weights and its batches): loaded when stored, else trained and stored."""
    task = make_task(task_name, **(task_settings or {}))
    seed = check_int("seed", seed, 0, 2**31 - 1)
    training = {k: v for k, v in asdict(cfg).items() if k != "eval_size"}  # no part in training
    settings = {"arch": arch, "task": task_name, "task_settings": asdict(task), "seed": seed, **training}

    def make() -> dict:
        model = build_model(arch, task, cfg, seed)
        rng = np.random.default_rng(seed)
        positions = task.sample(1, np.random.default_rng(0)).positions

        def batches():
            b = task.sample(cfg.batch, rng)
            return b.inputs, b.targets

        start = time.perf_counter()
        hist = fit(model, batches, cfg.n_steps, lr=cfg.lr, positions=positions, every=cfg.n_steps,
                   progress=progress, desc=f"{arch}, {task_name}, seed {seed}")
        return {"state": model.state_dict(), "loss": torch.as_tensor(hist.loss),
                "seconds": time.perf_counter() - start}

    saved, prov = load_or_make("primitives", settings, make, modules=[__name__])
    model = build_model(arch, task, cfg, seed)
    model.load_state_dict(saved["state"])
    return TrainedModel(arch, task, seed, model, saved["loss"].numpy(), saved["seconds"], prov)


def eval_batch(task, n: int) -> Batch:
    """The held-out sequences every model of the task is tested on."""
    return task.sample(check_int("n", n, 1, None), np.random.default_rng(EVAL_SEED))


def _bits(logp: Tensor, batch: Batch) -> Tensor:
    """Cross-entropy of each sequence, bits per supervised position."""
    return -logp.double().gather(-1, batch.targets[..., None])[..., 0].mean(-1) / math.log(2)


def floor_gap(model: nn.Module, task, batch: Batch) -> dict:
    """The model's cross-entropy, the Bayes predictor's and the task's baseline's on the
    same sequences, in bits per supervised position: their means, the mean gap to Bayes and
    its standard error over the sequences, the share of the attainable gain the model
    captures, (baseline - model) / (baseline - Bayes), and the model's accuracy."""
    with evaluating(model):
        logp, _ = log_probs_at(model, batch.inputs, batch.positions)
    model_ce, bayes_ce = _bits(logp, batch), _bits(task.bayes_log_probs(batch), batch)
    base = float(_bits(task.baseline_log_probs(batch), batch).mean())
    gap = model_ce - bayes_ce
    return {"model_bits": float(model_ce.mean()), "bayes_bits": float(bayes_ce.mean()), "baseline_bits": base,
            "share": (base - float(model_ce.mean())) / (base - float(bayes_ce.mean())),
            "gap_bits": float(gap.mean()), "gap_se": float(gap.std() / math.sqrt(len(gap))),
            "accuracy": float((logp.argmax(-1) == batch.targets).double().mean())}
