"""How a number becomes a verdict: the words of a verdict and of a row's kind, what a rule
reads from a record (:class:`Reading`) and what a claim is (:class:`Claim`), and the rules
themselves with the statistics they rest on: a ladder of bars judged on the 95% interval
over seeds, Welch's test against a reference, two one-sided tests for equivalence and for a
paired advantage against a margin named before the run, and steps to a level with the runs
that never reached it counted at the budget. The table of the paper's claims, each with the
rule that judges it, is :mod:`attention_dynamics.claims`."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .stats import mean_se

__all__ = ["HOLDS", "PARTLY", "FAILS", "INCONCLUSIVE", "UNMEASURED", "OBSERVED", "VERDICTS", "IDENTITY", "PAPER",
           "BEYOND", "KINDS", "Reading", "Claim", "ladder", "t_half_width", "seed_ladder", "welch_p",
           "agreement_verdict", "at_most", "equivalence", "seeds_for_band", "SAME", "PAIRED_RULE", "same_or_verdict",
           "as_losses", "paired_advantage", "censored_log_steps", "geometric_steps", "SAME_SPEEDUP", "steps_advantage"]


HOLDS, PARTLY, FAILS, INCONCLUSIVE, UNMEASURED, OBSERVED = (
    "holds", "holds partly", "does not hold", "inconclusive", "not measured", "observation only")


# OBSERVED: measured, but no correct model must pass the measurement, so it judges nothing
VERDICTS = (HOLDS, PARTLY, FAILS, INCONCLUSIVE, UNMEASURED, OBSERVED)


# What a row is: an identity checked numerically (exact by construction: it checks our code
# and the algebra, and is never evidence for the paper), the paper's claim tested
# empirically, or a result beyond the paper (the book's own extension).
IDENTITY, PAPER, BEYOND = "identity", "paper", "beyond"


KINDS = (IDENTITY, PAPER, BEYOND)


@dataclass(frozen=True)
class Reading:
    """What a rule reads from a record: the number (or a short text), its standard error and
    the number of seeds behind it where there are several, the verdict, and why a claim was
    not measured or is inconclusive."""

    value: float | str | None
    verdict: str
    se: float | None = None
    n: int | None = None
    why: str = ""


@dataclass(frozen=True)
class Claim:
    key: str  # a short name, unique: how a chapter refers to the claim
    result: str  # "R1" ... "R9"
    quantity: str  # what we measure
    paper: str  # the paper's (or the authors' script's) statement or number
    chapter: str  # the chapter whose record holds the numbers ("" for none)
    rule: str  # the verdict rule, in words
    read: Callable[[dict], Reading]  # the rule, in code
    fmt: str = "{:.3g}"
    tolerance: float | None = None  # how far the number may move between two paper builds and stay the same result
    kind: str = PAPER  # IDENTITY, PAPER or BEYOND
    # the instrument's positive control, read from the same record: where the claim is true by
    # construction and the instrument must say so (None: the instrument has none on record)
    control: Callable[[dict], str] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.key}: kind must be one of {KINDS}, got {self.kind!r}")


def ladder(x: float, holds: float, partly: float, *, higher_is_better: bool = True) -> str:
    s = 1 if higher_is_better else -1
    return HOLDS if s * x >= s * holds else PARTLY if s * x >= s * partly else FAILS


def t_half_width(se: float, n: int) -> float:
    """Half the width of the 95% t-interval of a mean of n values with standard error se."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.975, n - 1)) * se


def seed_ladder(values, holds: float, partly: float, *, higher_is_better: bool = True) -> Reading:
    """A ladder judged on the spread over seeds, so that a rerun whose float32 rounding
    differs (another processor, the kernels off) moves the mean within its interval and
    keeps the verdict where the seeds can tell: with the 95% t-interval of the mean (mean ±
    t_{0.975, n-1} se; 4.3 se for three seeds), *holds* if all of it clears the ``holds``
    bar, *does not hold* if all of it misses the ``partly`` bar, *holds partly* if all of it
    lies between the two bars, and *inconclusive* where it straddles a bar, where there is
    a single seed (no spread to judge by) or where a seed's number is not finite (a
    diverged run). No rule makes two reruns agree always: a mean that sits on a bar comes
    out inconclusive on most reruns and decisive on about one in twenty."""
    s = 1 if higher_is_better else -1
    if s * holds < s * partly:
        raise ValueError(f"the holds bar {holds} must be at least as good as the partly bar {partly} "
                         f"({'higher' if higher_is_better else 'lower'} is better)")
    a = np.asarray(values, dtype=float)
    if a.size == 0 or not np.isfinite(a).all():
        return Reading(None, INCONCLUSIVE, n=int(a.size), why="a seed's number is not finite (a diverged run)"
                       if a.size else "no seeds")
    m, se, n = mean_se(a)
    if n < 2:
        return Reading(m, INCONCLUSIVE, se, n, why="one seed: no spread to judge by")
    half = t_half_width(se, n)
    worst, best = m - s * half, m + s * half
    if s * worst >= s * holds:
        verdict = HOLDS
    elif s * best < s * partly:
        verdict = FAILS
    elif s * worst >= s * partly and s * best < s * holds:
        verdict = PARTLY
    else:
        verdict = INCONCLUSIVE
    return Reading(m, verdict, se, n, why=f"95% interval {min(worst, best):.3g} to {max(worst, best):.3g}"
                   + (", across a bar" if verdict == INCONCLUSIVE else ""))


def welch_p(values, ref_mean: float, ref_sd: float, ref_n: int, *, ref_ddof: int = 0) -> float:
    """Two-sided p of Welch's t-test between our per-seed values and a reference given as
    mean, standard deviation (with ``ref_ddof``, the authors' script prints np.std: 0) and n."""
    from scipy.stats import ttest_ind_from_stats

    a = np.asarray(values, dtype=float)
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    ref_sd1 = ref_sd * math.sqrt(ref_n / (ref_n - ref_ddof)) if ref_ddof == 0 else ref_sd
    if sd == 0 and ref_sd1 == 0:
        return 1.0 if a.mean() == ref_mean else 0.0
    return float(ttest_ind_from_stats(a.mean(), sd, a.size, ref_mean, ref_sd1, ref_n, equal_var=False).pvalue)


def agreement_verdict(p: float) -> str:
    """Consistent with the reference (holds) unless the difference is significant at 5%
    (partly) or at 1% (does not hold)."""
    return HOLDS if p >= 0.05 else PARTLY if p >= 0.01 else FAILS


def at_most(key: str, limit: float) -> Callable[[dict], Reading]:
    def read(v):
        return Reading(v[key], HOLDS if v[key] <= limit else FAILS)
    return read


def equivalence(lo: float, hi: float, low: float, high: float) -> str:
    """Two one-sided tests at 5%, given a 90% interval [lo, hi]: within [low, high] holds,
    wholly outside it does not hold, else inconclusive."""
    return HOLDS if low <= lo and hi <= high else FAILS if hi < low or lo > high else INCONCLUSIVE


def seeds_for_band(cv: float, band: float, most: int = 100_000) -> int:
    """The fewest seeds whose 90% t-interval of the mean steps fits inside the equivalence band
    when the mean sits at its centre (the paper's speedup), for a coefficient of variation
    ``cv`` of the steps over seeds: the half-width t(0.95, n-1) cv / sqrt(n) must stay within
    1 - 1/band of the mean (the band's nearer edge in steps). ``most`` if none up to it."""
    from scipy.stats import t as student_t

    room = 1 - 1 / band
    for n in range(2, most):
        if float(student_t.ppf(0.95, n - 1)) * cv / math.sqrt(n) <= room:
            return n
    return most


SAME = "the same within the margin"  # how a reading says "same" (readings.py phrases it)


PAIRED_RULE = ("the 90% interval of the paired differences (two one-sided tests at 5%): holds if all of it is past "
               "+margin; does not hold if all past −margin, or all within ±margin (the same), or all below 0; "
               "partly if all above 0; else inconclusive (also with a non-finite difference or one seed)")


def same_or_verdict(r: Reading) -> str:
    """A paired reading in a word: 'the same' when it found the two within the margin, else
    its verdict."""
    return "the same" if r.why.startswith(SAME) else r.verdict


def as_losses(values) -> np.ndarray:
    """Per-seed numbers from a record, where a diverged run was stored as null: inf."""
    return np.array([np.inf if x is None else x for x in values], dtype=float)


def paired_advantage(diffs, margin: float, unit: str = "nats") -> Reading:
    """Paired per-seed differences, baseline minus method (positive: the method is ahead),
    by their 90% t-interval (two one-sided tests at 5%), against a margin named before the
    run: ahead by more than the margin (holds) if all of it is at or above +margin; behind
    by more than the margin (does not hold) if all of it is at or below -margin; the same
    (does not hold) if all of it lies within ±margin; ahead, by an amount the seeds do not
    place against the margin (partly), if all of it is above 0; behind (does not hold) if
    all of it is below 0; else inconclusive. As the seeds agree more the verdict settles on
    the zone of the true difference: past the margin, within it, or past it the other way;
    it never goes from holds to anything else. A non-finite difference (a diverged run) or a
    single seed is inconclusive."""
    from scipy.stats import t as student_t

    d = np.asarray(diffs, dtype=float)
    if d.size < 2 or not np.isfinite(d).all():
        return Reading(None, INCONCLUSIVE, n=int(d.size),
                       why="a seed's difference is not finite (a diverged run)" if d.size > 1 else "one seed")
    m, se, n = mean_se(d)
    half = float(student_t.ppf(0.95, n - 1)) * se
    lo, hi = m - half, m + half
    interval = f"90% interval {lo:.3g} to {hi:.3g} {unit}, margin ±{margin:.3g}"
    if lo >= margin:
        return Reading(m, HOLDS, se, n, why=f"ahead by more than the margin ({interval})")
    if hi <= -margin:
        return Reading(m, FAILS, se, n, why=f"behind by more than the margin ({interval})")
    if -margin < lo and hi < margin:
        return Reading(m, FAILS, se, n, why=f"{SAME} ({interval})")
    if lo > 0:
        return Reading(m, PARTLY, se, n, why=f"ahead, by an amount the seeds do not place against the margin "
                       f"({interval})")
    if hi < 0:
        return Reading(m, FAILS, se, n, why=f"behind ({interval})")
    return Reading(m, INCONCLUSIVE, se, n, why=interval)


def censored_log_steps(steps, budget: int) -> np.ndarray:
    """Log steps to a level per seed, a run that never reached it (null: it diverged or ran
    out of steps) counted at budget + 1: a lower bound on its steps, so a method that fails
    is never made to look worse than it is (at step 0, counted as 1)."""
    return np.log(np.maximum([budget + 1 if x is None else x for x in steps], 1.0).astype(float))


def geometric_steps(steps, budget: int) -> float:
    """The geometric mean of steps to a level over seeds, unreached runs at budget + 1: the
    mean the paired log-step rule compares."""
    return float(np.exp(censored_log_steps(steps, budget).mean()))


# two speeds to a loss threshold within a factor 1.25 of each other count as the same
SAME_SPEEDUP = 1.25


def steps_advantage(baseline_steps, method_steps, budget: int) -> Reading:
    """Paired ln(steps of the baseline / steps of the method) to a level, per seed, against
    the margin ln 1.25. A run that never reached the level (null: it ran out of steps or
    diverged) counts at budget + 1, a lower bound on its steps; a seed on which neither
    reached says nothing about speed and is left out."""
    pairs = [(b, m) for b, m in zip(baseline_steps, method_steps) if not (b is None and m is None)]
    dropped = len(baseline_steps) - len(pairs)
    if not pairs:
        return Reading(None, INCONCLUSIVE, n=0, why="neither reached the level on any seed")
    b, m = zip(*pairs)
    r = paired_advantage(censored_log_steps(b, budget) - censored_log_steps(m, budget), math.log(SAME_SPEEDUP),
                         unit="(log steps)")
    censored = sum(x is None for x in b + m)
    notes = ([f"{censored} run(s) never reached it, counted at the budget"] if censored else []) + (
        [f"{dropped} seed(s) where neither reached, left out"] if dropped else [])
    return replace(r, why=r.why + ("; " + "; ".join(notes) if notes else ""))
