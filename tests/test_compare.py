"""The record comparison tool: it must say "the same" for the same records and report a moved
value, a moved claim and a flipped verdict, each where it is."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from attention_dynamics.book.compare import compare, compare_folders, is_timing, main
from attention_dynamics.book.scorecard import read_records

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "results" / "paper"


@pytest.fixture(scope="module")
def records():
    return read_records(PAPER)


def test_the_same_records_compare_as_the_same(records):
    result = compare(records, copy.deepcopy(records))
    assert not result.failed and result.moved == [] and result.n_values > 500
    from attention_dynamics.claims import CLAIMS

    assert len(result.claims) == sum(1 for c in CLAIMS if c.chapter in records) > 30
    assert result.lines()[-1] == "verdict: the same claims"


def test_a_claim_that_moves_beyond_its_tolerance_and_flips_is_reported(records):
    import numpy as np

    new = copy.deepcopy(records)
    old = records["wt_calibration"]["values"]["mae_bits_per_seed"]
    new["wt_calibration"]["values"]["mae_bits_per_seed"] = [0.05, 0.06, 0.055]  # far beyond 0.02
    result = compare(records, new)
    (change,) = [c for c in result.claims if c.fails]
    assert change.key == "r8_calibration" and change.beyond_tolerance and change.verdict_changed
    assert change.delta == pytest.approx(abs(0.055 - float(np.mean(old))))
    assert result.failed and any(line.startswith("CLAIM r8_calibration") for line in result.lines())
    assert {(m.chapter, m.key) for m in result.moved} == {("wt_calibration", f"mae_bits_per_seed[{i}]") for i in range(3)}


def test_a_move_within_tolerance_is_listed_but_not_failed(records):
    new = copy.deepcopy(records)
    v = new["wt_calibration"]["values"]
    v["mae_bits_per_seed"] = [x + 1e-9 for x in v["mae_bits_per_seed"]]  # far within the tolerance, 0.002
    result = compare(records, new)
    assert not result.failed
    (c,) = [c for c in result.claims if c.old != c.new]
    assert c.key == "r8_calibration" and not c.fails


def test_timings_and_nested_values_are_told_apart(records):
    new = copy.deepcopy(records)
    new["sticky_chain_speed"]["values"]["fast_ms_per_run_step"] *= 2
    name, value = next((k, v) for k, v in new["sticky_chain"]["values"].items()
                       if isinstance(v, list) and v and isinstance(v[0], float))
    value[0] += 1.0
    result = compare(records, new)
    keys = {(m.key, m.timing) for m in result.moved}
    assert ("fast_ms_per_run_step", True) in keys and (f"{name}[0]", False) in keys
    assert is_timing("seconds_per_seed") and is_timing("ms_per_step") and not is_timing("speedup")


def test_the_command_line_exits_by_the_claims(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(PAPER, a)
    shutil.copytree(PAPER, b)
    assert main([str(a), str(b)]) == 0
    path = b / "wt_calibration.json"
    record = json.loads(path.read_text())
    record["values"]["mae_bits_per_seed"] = [0.05, 0.06, 0.055]
    path.write_text(json.dumps(record))
    assert main([str(a), str(b)]) == 1
    assert "CLAIM r8_calibration" in capsys.readouterr().out
    assert main([str(a), str(tmp_path / "missing")]) == 2
    with pytest.raises(ValueError, match="is not a folder of records"):
        compare_folders(a, tmp_path / "missing")
