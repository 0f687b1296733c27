"""The wind tunnel's fair comparison (chapter *A fair comparison in the wind tunnel*): a
method at a base rate on some seeds as a tuning :class:`attention_dynamics.tuning.Trial`,
and the arms the test runs once tuning has chosen the rates. The chapter and the build's
plan (:mod:`attention_dynamics.book.plans`) both ask for the test runs through
:func:`test_arms`, so that the runs a build makes first are the ones the chapter loads."""
from __future__ import annotations

import dataclasses

import numpy as np

from .tuning import Trial, choose
from .windtunnel import WindTunnelConfig
from .windtunnel_rates import Run, train_run

__all__ = ["trial", "tuned_rates", "test_arms"]


def trial(cfg: WindTunnelConfig, method: str, lr: float, seeds, *, eval_every: int,
          slow: float) -> tuple[Trial, list[Run]]:
    """``method`` at base rate ``lr`` on ``seeds`` (``cfg`` at each seed), as a tuning Trial
    whose held-out loss is the KL in bits (a seed that diverged reads inf), and the runs
    behind it (stored: :func:`attention_dynamics.windtunnel_rates.train_run`)."""
    runs = [train_run(dataclasses.replace(cfg, seed=s), method, lr, eval_every=eval_every, slow=slow)
            for s in seeds]
    gone = {r.seed: r.diverged_at for r in runs if r.diverged_at is not None}
    t = Trial(method, lr, list(seeds), np.stack([r.train_loss for r in runs], 1),
              runs[0].eval_steps, np.stack([r.kl_bits for r in runs], 1),
              min(gone.values()) if len(gone) == len(runs) else None,
              sum(r.provenance["seconds"] for r in runs), gone)
    return t, runs


def tuned_rates(tuning: dict[str, list[Trial]]) -> dict[str, tuple[float, bool]]:
    """Each method's chosen rate and whether the grid brackets it
    (:func:`attention_dynamics.tuning.choose`)."""
    return {m: choose(trials) for m, trials in tuning.items()}


def test_arms(chosen: dict[str, tuple[float, bool]]) -> dict[str, tuple[str, float]]:
    """The test's arms, name -> (method, base rate): each method at its chosen rate, the
    ablation of the laws at work (all but the values slow) at AdamW's, and AdamW's twin at
    its rate x 1.05, the rule's negative control."""
    arms = {m: (m, lr) for m, (lr, _) in chosen.items()}
    arms["all but values slow"] = ("all but values slow", chosen["AdamW"][0])
    arms["control: AdamW twin"] = ("AdamW", chosen["AdamW"][0] * 1.05)
    return arms
