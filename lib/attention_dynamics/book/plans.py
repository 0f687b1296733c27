"""The stored models a chapter will ask for, known from its parameters before it runs, so
that a build can train them as tasks of their own (side by side, or spread over a Dask
cluster) and the chapter loads them instead of training them one after another.

A plan is a head start, never a second source of results: each task calls the very library
function the chapter calls, with the settings the chapter derives from the same parameters,
and the model lands in the shared store under the key the chapter asks for. A model a plan
misses is trained by the chapter itself (slower, the same numbers); a test holds each plan
to the models its chapter's record says it used. Models whose settings depend on results
(the fair comparison's test runs, at the rates tuning chose) come from a follow-up, a task
that reads the plan's first models and applies the chapter's own rule; the chapters' own
probes stay inside them.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .jobs import Job

__all__ = ["ModelTask", "plan", "follow_up", "run_model_task", "unused_planned", "PLANNED", "FOLLOW_UPS",
           "chapter_parameters"]


@dataclass(frozen=True)
class ModelTask:
    """One stored model to make: ``label`` names it in the log and the schedule; ``make``
    (a picklable call of a library function) loads or trains and stores it, returning an
    object with the stored model's ``provenance``."""

    label: str
    make: Callable[[], object]

    @property
    def identity(self) -> str:
        """The same for two tasks that make the same model in this process (the call and
        its arguments, dataclass settings included), so that it is made once."""
        return repr(self.make)


def run_model_task(task: ModelTask) -> tuple[str, float, str | None]:
    """Make one planned model (in a worker): its label, the seconds this call took and the
    file it is stored in (None where the store refused it: made through other computation
    paths than planned)."""
    start = time.perf_counter()
    made = task.make()
    path = made.provenance.get("path")
    return task.label, time.perf_counter() - start, Path(path).name if path else None


def _deep(p: dict) -> list[ModelTask]:
    from ..deep_variant import DeepVariant

    fields = {f.name for f in dataclasses.fields(DeepVariant)}
    deep = DeepVariant(**{k: v for k, v in p.items() if k in fields})
    return [ModelTask(f"deep variant, seed {s}", functools.partial(deep.train, s, progress=False))
            for s in p["seeds"]]


def _primitives(p: dict, tasks: list[str], archs) -> list[ModelTask]:
    from ..primitive_models import PrimitivesConfig, trained

    # eval_size plays no part in training (nor in the key): left at its default, so that
    # the two chapters' plans name one task per model
    cfg = dataclasses.replace(PrimitivesConfig.from_dict(p["setup"]), eval_size=PrimitivesConfig.eval_size)
    return [ModelTask(f"{arch} on {name}, seed {s}", functools.partial(trained, arch, name, s, cfg, progress=False))
            for name in tasks for arch in archs for s in p["seeds"]]


def _inference_primitives(p: dict) -> list[ModelTask]:
    from ..primitive_models import ARCHITECTURES
    from ..tasks.primitives import PRIMITIVES

    return _primitives(p, list(PRIMITIVES), ARCHITECTURES)


def _ssm_routing(p: dict) -> list[ModelTask]:
    return _primitives(p, [p["task"]], ("attention", "ssm"))


def _trajectories(p: dict, every: int, seeds: list[int], **changes) -> list[ModelTask]:
    from ..windtunnel import WindTunnelConfig

    cfg = WindTunnelConfig.from_dict(p["wind_tunnel"])
    out = []
    for s in seeds:
        # eval_size plays no part in a trajectory (nor in its key): at its default, the
        # three chapters' plans name one task per model
        c = dataclasses.replace(cfg, seed=s, eval_size=WindTunnelConfig.eval_size, **changes)
        what = ", ".join([f"seed {s}"] + [f"{k} = {v}" for k, v in changes.items()])
        out.append(ModelTask(f"wind tunnel, {what}, every {every}",
                             functools.partial(c.trajectory, every, progress=False)))
    return out


def _main_seed(p: dict) -> int:
    from ..windtunnel import WindTunnelConfig

    return WindTunnelConfig.from_dict(p["wind_tunnel"]).seed


def _wt_calibration(p: dict) -> list[ModelTask]:
    from ..windtunnel import WindTunnelConfig

    if p["time_budget_s"] > 0 or p["device"] != "cpu":
        # its steps are known only once a step is timed, and an accelerator takes one run at
        # a time: the chapter trains its runs itself, one after another (read as text: asking
        # CUDA here would start its driver in the process the pool then forks)
        return []
    cfg = WindTunnelConfig.from_dict(p["wind_tunnel"])
    seeds, V = [cfg.seed, *p["more_seeds"]], p["larger_V"]
    # the larger alphabet at the same compute (the chapter's rule: steps x tokens per sequence)
    big_steps = max(10, int(round(cfg.n_steps * cfg.task.length / (2 * (V - 1) + 1))))
    return (_trajectories(p, p["eval_every"], seeds)
            + _trajectories(p, p["eval_every"], seeds, V=V, L=V - 1, n_steps=big_steps))


def _wt_geometry(p: dict) -> list[ModelTask]:
    from ..windtunnel import WindTunnelConfig

    seeds = [_main_seed(p), *p["more_seeds"]]
    n_steps = WindTunnelConfig.from_dict(p["wind_tunnel"]).n_steps
    return (_trajectories(p, p["checkpoint_every"], seeds)
            + _trajectories(p, n_steps, [p["selection_seed"]])
            + _trajectories(p, n_steps, seeds, repeats=True))


def _wt_laws(p: dict) -> list[ModelTask]:
    from ..windtunnel import WindTunnelConfig
    from ..windtunnel_ablation import ablated, ablation_settings

    cfg = dataclasses.replace(WindTunnelConfig.from_dict(p["wind_tunnel"]), eval_size=WindTunnelConfig.eval_size)
    # the five ablations of the main seed, measured every probe_every; the two channels
    # frozen on the further seeds, measured at the end
    runs = [(name, cfg, p["probe_every"], how) for name, how in ablation_settings(cfg, p["em_slow_scale"]).items()]
    runs += [(f"{ch} frozen", dataclasses.replace(cfg, seed=s), cfg.n_steps, {"channel": ch})
             for s in p["ablation_seeds"] for ch in ("values", "pattern")]
    return (_trajectories(p, p["probe_every"], [cfg.seed, *p["ablation_seeds"]])
            + [ModelTask(f"wind tunnel, {name}, seed {c.seed}, every {every}",
                         functools.partial(ablated, c, every, progress=False, **how)) for name, c, every, how in runs])


def _wt_runs(p: dict, runs, what: str) -> list[ModelTask]:
    """Stored wind-tunnel runs (:func:`attention_dynamics.windtunnel_rates.train_run`), one
    task per (method, rate, seed) of ``runs``."""
    from ..windtunnel import WindTunnelConfig
    from ..windtunnel_rates import train_run

    cfg = WindTunnelConfig.from_dict(p["wind_tunnel"])
    return [ModelTask(f"{method} at {lr:g}, {what} seed {s}",
                      functools.partial(train_run, dataclasses.replace(cfg, seed=s), method, lr,
                                        eval_every=p["eval_every"], slow=p["slow"]))
            for method, lr, s in runs]


def _wt_grids(p: dict) -> dict[str, list[float]]:
    return {"AdamW": p["adamw_lrs"], "EM-style": p["adamw_lrs"], "SGD": p["sgd_lrs"]}


def _wt_tuned(p: dict) -> list[ModelTask]:
    return _wt_runs(p, [(m, lr, s) for m, lrs in _wt_grids(p).items() for lr in lrs for s in p["tuning_seeds"]],
                    "tuning")


def _wt_tuned_tests(p: dict) -> list[ModelTask]:
    """The test runs, at the rates tuning chose: read from the stored tuning runs (which the
    first tasks made), by the chapter's own rule (:mod:`attention_dynamics.wt_tuning`)."""
    from ..windtunnel import WindTunnelConfig
    from ..wt_tuning import test_arms, trial, tuned_rates

    run = functools.partial(trial, WindTunnelConfig.from_dict(p["wind_tunnel"]), eval_every=p["eval_every"],
                            slow=p["slow"])
    tuning = {m: [run(m, lr, p["tuning_seeds"])[0] for lr in lrs] for m, lrs in _wt_grids(p).items()}
    arms = test_arms(tuned_rates(tuning))
    return _wt_runs(p, [(m, lr, s) for m, lr in arms.values() for s in p["test_seeds"]], "test")


def _tuned_setups(p: dict) -> tuple[dict, dict]:
    """The keywords of the tuned comparison's sticky-chain and EM-task trials."""
    return ({k: p[k] for k in ("ratio", "n_steps", "seq_len", "eval_every", "dense_until")},
            {"task_seed": p["cluster_seed"], "ratio": p["ratio"], "n_steps": p["cluster_steps"]})


def _tuned_trials(p: dict, sticky, cluster, what: str) -> list[ModelTask]:
    """One task per stored trial (:mod:`attention_dynamics.tuned_trials`), ``sticky`` and
    ``cluster`` giving their (method, base rate, seeds)."""
    from ..tuned_trials import cluster_trial, sticky_trial

    s_kw, c_kw = _tuned_setups(p)
    return ([ModelTask(f"sticky chain, {m} at {lr:g}, {what} seeds",
                       functools.partial(sticky_trial, m, lr, seeds, **s_kw)) for m, lr, seeds in sticky]
            + [ModelTask(f"EM task, {m} at {lr:g}, {what} seeds",
                         functools.partial(cluster_trial, m, lr, seeds, **c_kw)) for m, lr, seeds in cluster])


def _tuned_grids(p: dict) -> tuple[dict, dict]:
    from ..tuned_arms import method_grids

    return (method_grids(p["sgd_lrs"], p["adam_lrs"], p["base_lrs"]),
            method_grids(p["cluster_sgd_lrs"], p["cluster_adam_lrs"], p["cluster_base_lrs"], "cluster "))


def _tuned_baselines(p: dict) -> list[ModelTask]:
    from ..tuned_arms import check_seeds_apart

    check_seeds_apart(p["tuning_seeds"], p["test_seeds"], p["cluster_tuning_seeds"], p["cluster_test_seeds"])
    grids, c_grids = _tuned_grids(p)
    return _tuned_trials(p, [(m, lr, p["tuning_seeds"]) for m, g in grids.items() for lr in g],
                         [(m, lr, p["cluster_tuning_seeds"]) for m, g in c_grids.items() for lr in g], "tuning")


def _tuned_baselines_tests(p: dict) -> list[ModelTask]:
    """The test trials, at the rates tuning chose: read from the stored tuning trials (which
    the first tasks made), by the chapter's own rules (:mod:`attention_dynamics.tuned_arms`)."""
    from ..tuned_arms import cluster_arms, cluster_score, held_out_levels, sticky_arms, sticky_score, tuned_rates
    from ..tuned_trials import cluster_trial, sticky_trial

    grids, c_grids = _tuned_grids(p)
    s_kw, c_kw = _tuned_setups(p)
    levels, _ = held_out_levels(p["tuning_seeds"], seq_len=p["seq_len"], level_fraction=p["level_fraction"])
    tuning = {m: [sticky_trial(m, lr, p["tuning_seeds"], **s_kw) for lr in g] for m, g in grids.items()}
    c_tuning = {m: [cluster_trial(m, lr, p["cluster_tuning_seeds"], **c_kw) for lr in g] for m, g in c_grids.items()}
    arms = sticky_arms(tuned_rates(tuning, sticky_score(levels)), p["protocol_lr"])
    c_arms = cluster_arms(tuned_rates(c_tuning, cluster_score(p["cluster_threshold"])), p["cluster_routing_lr"])
    return _tuned_trials(p, [(m, lr, p["test_seeds"]) for m, lr in arms.values()],
                         [(m, lr, p["cluster_test_seeds"]) for m, lr in c_arms.values()], "test")


PLANNED: dict[str, Callable[[dict], list[ModelTask]]] = {
    "sticky_chain_deep": _deep, "inference_primitives": _inference_primitives, "ssm_routing": _ssm_routing,
    "wt_calibration": _wt_calibration, "wt_geometry": _wt_geometry, "wt_laws": _wt_laws, "wt_tuned": _wt_tuned,
    "tuned_baselines": _tuned_baselines,
}


# Models whose settings depend on results: made when the plan's first tasks are (a task of
# its own computes them, from the stored models, by the chapter's rule)
FOLLOW_UPS: dict[str, Callable[[dict], list[ModelTask]]] = {"wt_tuned": _wt_tuned_tests,
                                                            "tuned_baselines": _tuned_baselines_tests}


def chapter_parameters(job: Job) -> dict:
    """The parameters the chapter will run with: its notebook's defaults (literals, as
    papermill requires) under the job's profile values and overrides."""
    import ast

    import papermill as pm

    from .parameters import check_values, declared_chapters

    defaults = {name: ast.literal_eval(p["default"]) for name, p in pm.inspect_notebook(str(job.notebook)).items()}
    values = defaults | dict(job.parameters)
    # as the notebook reads them (start_chapter checks them so): 3 as a rate becomes 3.0
    return values | check_values(job.name, values) if job.name in declared_chapters() else values


def plan(job: Job) -> list[ModelTask]:
    """The models chapter ``job`` will ask for, at its parameters (none for a chapter
    without a plan)."""
    maker = PLANNED.get(job.name)
    return maker(chapter_parameters(job)) if maker else []


def follow_up(job: Job) -> Callable[[], list[ModelTask]] | None:
    """For a chapter some of whose models depend on results: a picklable call that, once
    the plan's first models exist, returns the tasks that make the rest."""
    maker = FOLLOW_UPS.get(job.name)
    return functools.partial(maker, chapter_parameters(job)) if maker else None


def unused_planned(result) -> list[str]:
    """The models a chapter's plan made first that the chapter did not then load (a
    :class:`attention_dynamics.book.jobs.JobResult`): empty when the plan and the chapter
    agree; otherwise the plan's settings drifted from the chapter's, and the chapter trained
    its own."""
    from ..store import recorded_models

    loaded = {m["file"] for m in recorded_models(result.record.get("provenance", {}).get("models")) if m["loaded"]}
    return sorted(set(result.planned) - loaded)
