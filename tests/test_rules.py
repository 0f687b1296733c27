"""The rules common to many claims (attention_dynamics.rules) on inputs whose verdict is known:
the paired advantage can say the same, ahead, behind and undecided, and settles as the seeds
agree; the seed ladder judges the interval, not the mean; the seeds an equivalence band needs."""
from __future__ import annotations

import numpy as np
import pytest

from attention_dynamics.rules import FAILS, HOLDS, INCONCLUSIVE, PARTLY
from attention_dynamics.rules import SAME, paired_advantage


def test_paired_advantage_can_say_same_ahead_behind_and_undecided():
    margin = 0.025
    same = paired_advantage([0.001, -0.002, 0.003, 0.0, 0.001], margin)
    assert same.verdict == FAILS and same.why.startswith(SAME)
    assert paired_advantage([0.04, 0.045, 0.05], margin).verdict == HOLDS
    assert paired_advantage([0.03, 0.04, 0.05], margin).verdict == PARTLY  # above 0, across the margin
    assert paired_advantage([-0.04, -0.045, -0.05], margin).why.startswith("behind by more than the margin")
    assert paired_advantage([-0.03, -0.04, -0.05], margin).why.startswith("behind (")  # below 0, across it
    assert paired_advantage([-0.05, 0.0, 0.08], margin).verdict == INCONCLUSIVE  # straddles everything
    assert paired_advantage([0.03, float("inf"), 0.05], margin).verdict == INCONCLUSIVE
    assert paired_advantage([0.03], margin).verdict == INCONCLUSIVE
    # a small sure difference inside the margin is the same, whichever its sign
    assert paired_advantage([0.0015, 0.0018, 0.0021], margin).why.startswith(SAME)
    assert paired_advantage([-0.0015, -0.0018, -0.0021], margin).why.startswith(SAME)


def test_a_tighter_interval_settles_on_the_zone_of_the_true_difference():
    """The same mean difference, the seeds agreeing more and more: the verdict moves from
    inconclusive (or partly) to the zone the mean lies in, and never leaves holds once
    there (the first version checked "same" before "ahead" and so turned a small effect the
    wrong way as the seeds agreed; the second called a sure effect inside the margin ahead)."""
    margin = 0.025
    for mean, end in ((0.04, HOLDS), (0.0141, "same"), (0.0, "same"), (-0.04, "behind by more")):
        seen = []
        for spread in (0.03, 0.01, 0.005, 0.002, 0.0005):
            seen.append(paired_advantage(mean + spread * np.array([-2, -1, 0, 1, 2]), margin))
        last = seen[-1]
        assert last.verdict == end if end == HOLDS else last.why.startswith(SAME if end == "same" else end), seen
        if HOLDS in [r.verdict for r in seen]:
            first = [r.verdict for r in seen].index(HOLDS)
            assert all(r.verdict == HOLDS for r in seen[first:])


def test_the_seed_ladder_judges_the_interval_not_the_mean():
    from attention_dynamics.rules import seed_ladder

    # lower is better, bars 0.01 (holds) and 0.02 (partly); three seeds: mean ± 4.30 se
    assert seed_ladder([0.004, 0.005, 0.006], 0.01, 0.02, higher_is_better=False).verdict == HOLDS
    assert seed_ladder([0.013, 0.014, 0.015], 0.01, 0.02, higher_is_better=False).verdict == PARTLY
    assert seed_ladder([0.05, 0.04, 0.06], 0.01, 0.02, higher_is_better=False).verdict == FAILS
    # a mean below the bar whose interval reaches above it: not "holds"
    wide = seed_ladder([0.002, 0.005, 0.017], 0.01, 0.02, higher_is_better=False)
    assert wide.verdict == INCONCLUSIVE and wide.value < 0.01 and "across a bar" in wide.why
    # the width is the t quantile's: mean 0.007, se 0.001; 2 se clears 0.01, 4.30 se does not
    t_width = seed_ladder([0.007 - 0.001 * 3**0.5, 0.007, 0.007 + 0.001 * 3**0.5], 0.01, 0.02,
                          higher_is_better=False)
    assert t_width.se == pytest.approx(0.001) and t_width.verdict == INCONCLUSIVE
    one = seed_ladder([0.004], 0.01, 0.02, higher_is_better=False)
    assert one.verdict == INCONCLUSIVE and one.n == 1
    two = seed_ladder([0.004, 0.0045], 0.01, 0.02, higher_is_better=False)  # 12.7 se with two seeds
    assert two.verdict == HOLDS and seed_ladder([0.004, 0.006], 0.01, 0.02, higher_is_better=False).verdict == INCONCLUSIVE
    diverged = seed_ladder([0.004, float("nan"), 0.005], 0.01, 0.02, higher_is_better=False)
    assert diverged.verdict == INCONCLUSIVE and "not finite" in diverged.why
    with pytest.raises(ValueError, match="holds bar 0.02 must be at least as good as the partly bar 0.01"):
        seed_ladder([0.004, 0.005], 0.02, 0.01, higher_is_better=False)
    # higher is better, bars 0.8 and 0.5
    assert seed_ladder([0.85, 0.9, 0.88], 0.8, 0.5).verdict == HOLDS
    assert seed_ladder([0.6, 0.62, 0.61], 0.8, 0.5).verdict == PARTLY
    assert seed_ladder([0.3, 0.35, 0.25], 0.8, 0.5).verdict == FAILS
    assert seed_ladder([0.45, 0.52, 0.49], 0.8, 0.5).verdict == INCONCLUSIVE  # the AMD / Intel split of issue 17


def test_seeds_for_band_is_the_fewest_whose_interval_fits_the_band():
    from scipy.stats import t as student_t

    from attention_dynamics.claims import PAPER_SPEEDUP_BAND
    from attention_dynamics.rules import seeds_for_band

    room = 1 - 1 / PAPER_SPEEDUP_BAND
    half = lambda n, cv: float(student_t.ppf(0.95, n - 1)) * cv / np.sqrt(n)  # noqa: E731
    for cv in (0.01, 0.1, 0.4, 1.0):
        n = seeds_for_band(cv, PAPER_SPEEDUP_BAND)
        assert half(n, cv) <= room and (n == 2 or half(n - 1, cv) > room), (cv, n)
    assert seeds_for_band(0.4, PAPER_SPEEDUP_BAND) > 5  # the R7 runs' spread: five seeds cannot decide
    assert seeds_for_band(1e6, PAPER_SPEEDUP_BAND, most=50) == 50
