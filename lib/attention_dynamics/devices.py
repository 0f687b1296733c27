"""Where a wind-tunnel run trains: the CPU, or an accelerator where one is present (the
``gpu`` profile of chapter *Calibration*, at Paper I's size), and how many steps of it fit a
time budget there.

Nothing depends on a device. On the CPU a run is the stored plain run the wind-tunnel
chapters share (:meth:`attention_dynamics.windtunnel.WindTunnelConfig.trajectory`), and
``"auto"`` falls back to it where no CUDA device is present. A run on an accelerator draws
the same sequences (the CPU generator of the CPU run), is stored under a key of its own (the
device type is one of its settings) and keeps its checkpoints on the CPU, so that every
measurement reads it as it reads a CPU run. On CUDA the run is not bit-reproducible (PyTorch's
index and embedding backward passes add with atomics), so two builds there differ in the last
digits as two processors do; its key names the device, CUDA and the GPU, so that runs made
through other computation paths never share a stored model.

Why not a ``device`` setting of :class:`~attention_dynamics.windtunnel.WindTunnelConfig`:
the stored models' keys cover that module's code, and every committed paper-scale record
rests on them; this module reaches the same loop (:func:`attention_dynamics.transformer.fit`)
from outside, and the CPU path stays the config's own."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, replace

import torch

from .artifacts import load_or_make
from .machine import cpu_model
from .tasks.bijection import sample_batch, supervised_positions
from .transformer import fit
from .validation import check_choice, check_float, check_int
from .windtunnel import Trajectory, WindTunnelConfig

__all__ = ["DEVICES", "resolve_device", "device_label", "trajectory_on", "seconds_per_step", "steps_that_fit"]

DEVICES = ("cpu", "cuda", "auto")


def resolve_device(name: str) -> torch.device:
    """The device ``name`` asks for: ``"cpu"``, ``"cuda"`` (refused with the reason where
    no CUDA device is present) or ``"auto"`` (CUDA where present, else the CPU)."""
    check_choice("device", name, DEVICES)
    if name == "cpu":  # without asking CUDA: a process pool may fork this process afterwards
        return torch.device("cpu")
    has_cuda = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda" if has_cuda else "cpu")
    if name == "cuda" and not has_cuda:
        raise ValueError(f"device = 'cuda', but this machine has no CUDA device (torch {torch.__version__}: "
                         "torch.cuda.is_available() is False); use 'auto' to fall back to the CPU, or 'cpu'")
    return torch.device(name)


def device_label(device: torch.device | str) -> str:
    """The device in words, for the record and the text: the GPU's name, or the CPU's."""
    device = torch.device(device)
    if device.type == "cuda":
        runtime = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        return f"{torch.cuda.get_device_name(device)} ({runtime}, torch {torch.__version__})"
    return f"the CPU, {torch.get_num_threads()} thread(s) of {cpu_model()}"


def trajectory_on(config: WindTunnelConfig, every: int, device: torch.device | str, *, progress: bool = True,
                  desc: str = "wind tunnel") -> Trajectory:
    """The plain run of ``config`` trained on ``device``, with its states every ``every``
    steps (as :meth:`WindTunnelConfig.trajectory`): on the CPU that very run; elsewhere
    loaded when stored, else trained there and stored. Its provenance names the device."""
    device = torch.device(device)
    if device.type == "cpu":
        return config.trajectory(every, progress=progress, desc=desc)
    return _trajectory_on(config, every, device, progress=progress, desc=desc)


def _trajectory_on(config: WindTunnelConfig, every: int, device: torch.device, *, progress: bool,
                   desc: str) -> Trajectory:
    """:func:`trajectory_on` through the accelerator's path, whatever ``device`` is (the
    tests run it on the CPU against the config's own run)."""
    every = check_int("every", every, 1, config.n_steps)
    settings = {k: v for k, v in asdict(config).items() if k != "eval_size"} | {"every": every,
                                                                                "device": device_label(device)}

    def make() -> dict:
        model = config.model().to(device)

        def keep(step, params, out):
            return {"model": _on_cpu(model.state_dict()), "optimizer": _on_cpu(out.info["optimizer"].state_dict())}

        hist = _train(config, model, device, callback=keep, every=every, progress=progress, desc=desc)
        return {"loss": torch.as_tensor(hist.loss), "steps": [s for s, _ in hist.checkpoints],
                "states": [c for _, c in hist.checkpoints], "device": device_label(device)}

    payload, provenance = load_or_make("windtunnel", settings, make, modules=[__name__])
    return Trajectory(config, payload["loss"].numpy(), payload["steps"], payload["states"],
                      dict(provenance, device=payload["device"]))


def _train(config: WindTunnelConfig, model, device: torch.device, **kw):
    """``config``'s training (:meth:`WindTunnelConfig.train`, all roles at ``lr``) of a
    model on ``device``: the sequences drawn on the CPU from the generator the CPU run
    draws from, then moved."""
    task = config.task
    gen = torch.Generator().manual_seed(config.seed)

    def batches():
        tokens, targets = sample_batch(task, config.batch, gen)
        return tokens.to(device), targets.to(device)

    return fit(model, batches, config.n_steps, lr=config.lr, positions=supervised_positions(task).to(device), **kw)


def _on_cpu(state):
    """A state dict (nested dicts and lists of tensors and numbers) copied to the CPU."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _on_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_on_cpu(v) for v in state)
    return state


def seconds_per_step(config: WindTunnelConfig, device: torch.device | str, *, steps: int = 100,
                     warmup: int = 10) -> float:
    """Wall seconds of one of ``config``'s training steps on ``device``: ``warmup + steps``
    steps of a fresh model through the same loop, the first ``warmup`` not counted (the
    accelerator's start, the allocator's first requests; a hundred steps, about half a second
    on an H100 at Paper I's size, average over the clock's ramp). Stores nothing."""
    steps = check_int("steps", steps, 1, 10_000)
    warmup = check_int("warmup", warmup, 1, 10_000)
    device = torch.device(device)
    probe = replace(config, n_steps=max(10, warmup + steps))
    stamps = {}

    def stamp(step, params, out):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stamps[step] = time.perf_counter()

    _train(probe, probe.model().to(device), device, callback=stamp, every=1, progress=False)
    return (stamps[warmup + steps] - stamps[warmup]) / steps


def steps_that_fit(step_seconds: float, budget_s: float, *, runs: int, n_steps: int, minimum: int = 10) -> int:
    """The most steps each of ``runs`` runs can take, one after another, within
    ``budget_s`` seconds at ``step_seconds`` a step, and never more than ``n_steps``;
    refused when fewer than ``minimum`` fit."""
    step_seconds = check_float("step_seconds", step_seconds, 0.0, None, low_open=True)
    budget_s = check_float("time_budget_s", budget_s, 0.0, None, low_open=True)
    runs = check_int("runs", runs, 1, None)
    n_steps = check_int("n_steps", n_steps, 1, None)
    fit_steps = min(n_steps, math.floor(budget_s / (runs * step_seconds)))
    if fit_steps < minimum:
        raise ValueError(f"time_budget_s = {budget_s:g} fits {fit_steps} steps of each of the {runs} runs at "
                         f"{step_seconds:.4g} s a step; at least {minimum} are needed: raise time_budget_s")
    return fit_steps
