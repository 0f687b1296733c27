"""The record comparison tool: it must say "the same" for the same records and report a moved
value, a moved claim, a flipped verdict, a missing chapter and a record today's rules cannot
read, each where it is."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from attention_dynamics.book.compare import compare, compare_folders, is_timing, main
from attention_dynamics.book.scorecard import read_records
from attention_dynamics.claims import CLAIMS

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "results" / "paper"


def calibration(per_seed, **more) -> dict:
    """A wind-tunnel calibration record holding what r8_calibration reads, and what the
    chapter's other rows read (the same in every record these tests compare)."""
    rest = {"kl_bits_per_seed": [0.004, 0.005, 0.006], "big_mae_bits_per_seed": [0.30, 0.31, 0.32]}
    return {"values": {"mae_bits_per_seed": list(per_seed), "mae_bits": per_seed[0], **rest, **more},
            "provenance": {"profile": "paper", "parameters": {}, "paths": {"causal_attention": "torch"}}}


def test_the_committed_records_compare_as_the_same():
    records = read_records(PAPER)
    result = compare(records, copy.deepcopy(records))
    assert not result.failed and result.moved == [] and result.n_values > 500 and result.provenance == []
    assert len(result.claims) == sum(1 for c in CLAIMS if c.chapter in records) > 30
    assert result.lines()[-1] == "verdict: the same claims"


def test_a_claim_that_moves_beyond_its_tolerance_and_flips_is_reported():
    old = {"wt_calibration": calibration([0.004, 0.005, 0.006])}
    new = {"wt_calibration": calibration([0.05, 0.06, 0.055])}
    result = compare(old, new)
    (change,) = [c for c in result.claims if c.fails]
    assert change.key == "r8_calibration" and change.beyond_tolerance and change.verdict_changed
    assert change.delta == pytest.approx(0.055 - 0.005)
    assert result.failed and any(line.startswith("CLAIM r8_calibration") for line in result.lines())
    assert {m.key for m in result.moved} == {"mae_bits", "mae_bits_per_seed[0]", "mae_bits_per_seed[1]",
                                             "mae_bits_per_seed[2]"}


def test_a_move_within_tolerance_is_listed_but_not_failed():
    old = {"wt_calibration": calibration([0.004, 0.005, 0.006])}
    new = {"wt_calibration": calibration([0.0045, 0.0055, 0.0065])}  # the mean moves 0.0005; tolerance 0.002
    result = compare(old, new)
    (c,) = [c for c in result.claims if c.old != c.new]
    assert c.key == "r8_calibration" and not c.fails and not result.failed and c.delta == pytest.approx(0.0005)


def test_a_mean_over_seeds_may_move_by_two_standard_errors_of_the_difference():
    import numpy as np

    wide_old, wide_new = [0.002, 0.009, 0.016], [0.006, 0.013, 0.020]  # se 0.004 each; the mean moves 0.004
    result = compare({"wt_calibration": calibration(wide_old)}, {"wt_calibration": calibration(wide_new)})
    (c,) = [c for c in result.claims if c.key == "r8_calibration"]
    se = np.std(wide_old, ddof=1) / 3**0.5
    assert c.tolerance == pytest.approx(2 * (2 * se**2) ** 0.5) and c.tolerance > 0.002 and c.delta == pytest.approx(0.004)
    assert not c.beyond_tolerance


def test_a_missing_chapter_and_an_unreadable_record_fail():
    old = {"wt_calibration": calibration([0.004, 0.005, 0.006]), "value_law": {"values": {}}}
    result = compare(old, {"wt_calibration": calibration([0.004, 0.005, 0.006])})
    assert result.failed and result.only_old == ["value_law"]
    assert any(line.startswith("MISSING from the new set: value_law") for line in result.lines())
    stale = {"wt_calibration": {"values": {"mae_bits": 0.0048}}}  # written before the rule read seeds
    result = compare(stale, {"wt_calibration": calibration([0.004, 0.005, 0.006])})
    failing = {c.key: c for c in result.claims if c.fails}  # every row of the chapter reads what it lacks
    assert set(failing) == {c.key for c in CLAIMS if c.chapter == "wt_calibration"}
    assert "cannot read the old record" in failing["r8_calibration"].unreadable


def test_changes_of_kind_and_timings_are_told_apart():
    old = {"wt_calibration": calibration([0.004, 0.005, 0.006], seconds=10.0, meets_target=True, flag=1,
                                         reading="a", nested={"a": [1.0, 2.0]})}
    new = copy.deepcopy(old)
    v = new["wt_calibration"]["values"]
    v["seconds"], v["meets_target"], v["flag"], v["reading"] = 20.0, 1, True, "b"
    v["nested"]["a"][1] = 2.5
    new["wt_calibration"]["provenance"]["paths"] = {"causal_attention": "kernel (native)"}
    result = compare(old, new)
    moved = {m.key: m for m in result.moved}
    assert set(moved) == {"seconds", "meets_target", "flag", "reading", "nested.a[1]"}  # True is not 1
    assert moved["seconds"].timing and not moved["nested.a[1]"].timing
    lines = result.lines()
    values_listed = [line for line in lines if line.startswith("  wt_calibration.")]
    assert values_listed[-1].startswith("  wt_calibration.nested.a[1]")  # numbers last, changes of kind first
    assert any("made differently: wt_calibration paths" in line for line in lines) and not result.failed
    assert is_timing("seconds_per_seed") and is_timing("ms_per_step") and not is_timing("speedup")
    # a timing that is a mapping or a list: the key of each entry carries the timing's name
    assert all(map(is_timing, ["sticky_seconds.Adam", "ms_per_step.SGD", "held_out_at_equal_time.SGD",
                               "adam_over_sgd_time", "train_seconds", "seconds[2]"]))
    assert not any(map(is_timing, ["mstep_final_per_seed[0]", "two_timescale", "params_ssm", "speedup_best_vs_1",
                                   "n_steps", "terms", "times[0]"]))


def test_the_command_line_exits_by_the_claims(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "wt_calibration.json").write_text(json.dumps(calibration([0.004, 0.005, 0.006])))
    shutil.copy(a / "wt_calibration.json", b / "wt_calibration.json")
    assert main([str(a), str(b)]) == 0
    (b / "wt_calibration.json").write_text(json.dumps(calibration([0.05, 0.06, 0.055])))
    assert main([str(a), str(b)]) == 1
    assert "CLAIM r8_calibration" in capsys.readouterr().out
    assert main([str(a), str(tmp_path / "missing")]) == 2
    with pytest.raises(ValueError, match="is not a folder of records"):
        compare_folders(a, tmp_path / "missing")


def test_the_publishing_check_passes_the_committed_records_and_fails_a_moved_claim(tmp_path, capsys):
    """The comparison step of .github/workflows/book.yml on the committed records: against a
    copy of themselves, with a timing and the provenance changed as another machine changes
    them, it passes; with one number moved within its claim's tolerance it passes and lists
    the key; moved beyond it, it exits 1 naming the claim and the key."""
    new = tmp_path / "new"
    shutil.copytree(PAPER, new)

    def edit(name, change):
        path = new / f"{name}.json"
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    def machine(record):
        record["values"]["sticky_seconds"]["Adam"] *= 3
        record["values"]["held_out_at_equal_time"]["SGD"] += 1.0
        record["provenance"].update(seconds=1.0, machine="x86_64, 4 CPUs", cpu="another processor",
                                    threads=4, git_commit="0" * 40, executed_at="2027-01-01T00:00:00Z")

    edit("tuned_baselines", machine)
    assert main([str(PAPER), str(new)]) == 0
    out = capsys.readouterr().out
    assert "values that differ: 0 of " in out and "(and 2 timings)" in out
    assert out.rstrip().endswith("verdict: the same claims")

    key = "fixed_point_distance_overlapping"  # r6_soft's number; its tolerance is 1e-3
    base = json.loads((PAPER / "two_timescale_em.json").read_text())["values"][key]
    edit("two_timescale_em", lambda r: r["values"].update({key: base + 0.0005}))
    assert main([str(PAPER), str(new)]) == 0
    out = capsys.readouterr().out
    assert f"two_timescale_em.{key}:" in out and "CLAIM" not in out

    edit("two_timescale_em", lambda r: r["values"].update({key: base + 0.01}))  # the verdict stays
    assert main([str(PAPER), str(new)]) == 1
    out = capsys.readouterr().out
    assert "CLAIM r6_soft (two_timescale_em)" in out and "[moved 0.01 > tolerance 0.001]" in out
    assert f"two_timescale_em.{key}:" in out and out.rstrip().endswith("verdict: DIFFERENT (a claim changed, or a chapter is missing)")


def test_a_wider_spread_in_the_new_run_earns_no_wider_allowance():
    """The allowance for a mean over seeds comes from the committed record's spread alone:
    a new run whose seeds scatter more, and whose mean moved beyond that allowance, fails."""
    tight_old, wide_new = [0.004, 0.005, 0.006], [0.002, 0.012, 0.022]  # the mean moves 0.007
    result = compare({"wt_calibration": calibration(tight_old)}, {"wt_calibration": calibration(wide_new)})
    (c,) = [c for c in result.claims if c.key == "r8_calibration"]
    se_old = 0.001 / 3**0.5  # the committed seeds' standard error
    assert c.tolerance == pytest.approx(max(0.002, 2 * 2**0.5 * se_old)) == 0.002
    assert c.delta == pytest.approx(0.007) and c.beyond_tolerance and result.failed


def test_a_claim_whose_committed_seeds_scatter_is_reported_as_judged_loosely():
    """The committed wind-tunnel calibration has one seed at 0.005 bits and two near 0.38: two
    standard errors of the difference allow its mean to move by about 0.35 bits, so even every
    seed's error doubled passes. The comparison cannot see that move, and says so."""
    old = read_records(PAPER)
    new = copy.deepcopy(old)
    vals = new["wt_calibration"]["values"]
    for k in ("mae_bits_per_seed", "kl_bits_per_seed"):
        vals[k] = [2 * v for v in vals[k]]
    result = compare(old, new)
    (c,) = [c for c in result.claims if c.key == "r8_calibration"]
    assert c.delta > 0.2 and not c.beyond_tolerance and c.loose  # the instrument's limit, stated
    assert any(line.startswith("judged loosely") and "r8_calibration" in line for line in result.lines())
    tight = compare({"wt_calibration": calibration([0.004, 0.005, 0.006])},
                    {"wt_calibration": calibration([0.008, 0.010, 0.012])})
    assert tight.failed and not any(c.loose for c in tight.claims)  # where the seeds agree, a doubling fails


def test_a_number_that_disappears_fails_even_with_the_same_verdict():
    old = {"wt_calibration": calibration([0.004, 0.005, 0.006])}
    c_old = [c for c in compare(old, old).claims if c.key == "r8_calibration"][0]
    assert not c_old.fails
    from attention_dynamics.book.compare import ClaimChange

    gone = ClaimChange("x", "ch", "0.1 (holds)", "— (holds)", None, 0.01, False, lost_number=True)
    assert gone.fails and not gone.beyond_tolerance
