"""The schedule simulation of benchmarks/book_schedule.py on cases solved by hand."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("book_schedule", ROOT / "benchmarks" / "book_schedule.py")
bs = importlib.util.module_from_spec(spec)
sys.modules["book_schedule"] = bs  # its dataclasses look their module up
spec.loader.exec_module(bs)


def test_a_shared_model_is_trained_once_and_waited_for():
    # B (longer) starts first and trains m; A, on the other worker, waits for m, then runs
    chapters = [bs.Chapter("A", 10.0, {"m": 100.0}), bs.Chapter("B", 20.0, {"m": 100.0})]
    wall, schedule = bs.whole_chapters(chapters, 2, fresh=True)
    assert wall == 120.0 and sorted(schedule) == [("A", 1, 0.0, 110.0), ("B", 0, 0.0, 120.0)]
    assert bs.whole_chapters(chapters, 2, fresh=False)[0] == 20.0  # warm: nothing to train
    assert bs.whole_chapters(chapters, 1, fresh=True)[0] == 130.0  # one worker: everything once


def test_models_as_tasks_start_the_longest_path_first_and_meet_the_bound():
    # m then A is the critical path (110 s); B fills the other worker meanwhile
    chapters = [bs.Chapter("A", 10.0, {"m": 100.0}), bs.Chapter("B", 50.0, {}), bs.Chapter("C", 40.0, {})]
    wall, schedule = bs.models_as_tasks(chapters, 2, fresh=True)
    assert wall == 110.0 and schedule[0][:3] == ("m", 0, 0.0)
    bound, chain = bs.lower_bound(chapters, 2, fresh=True)
    assert bound == 110.0 and chain.startswith("critical path 110 s: m (100 s), then A")
    # with one worker the summed seconds bind, not the path
    assert bs.lower_bound(chapters, 1, fresh=True)[0] == 200.0 == bs.models_as_tasks(chapters, 1, fresh=True)[0]
    # whole chapters cannot overlap m with B and C as well: A trains m itself
    assert bs.whole_chapters(chapters, 2, fresh=True)[0] == 110.0


def test_records_without_their_models_are_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"provenance": {"chapter": "a", "seconds": 5.0}}))
    with pytest.raises(SystemExit, match="no list of stored models"):
        bs.read_chapters(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"provenance": {
        "chapter": "a", "seconds": 50.0, "cpu": "X", "threads": 1,
        "models": [{"file": "m.pt", "seconds": 30.0, "loaded": False}, {"file": "n.pt", "seconds": 7.0, "loaded": True}]}}))
    (chapter,), cpus = bs.read_chapters(tmp_path)
    assert chapter.own == 20.0 and chapter.models == {"m.pt": 30.0, "n.pt": 7.0} and cpus == {"X, 1 thread(s)"}


def test_the_readmes_build_times_are_the_committed_records():
    """The README's hours for a paper build are computed from results/paper, not typed in: a
    rebuild that moves one of them by a tenth of an hour turns this red until the README says
    so. Negative control: a tenth of an hour more in one record moves the total."""
    import re

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = {key: float(re.search(pattern, readme).group(1)) for key, pattern in {
        "fresh": r"add up to about ([\d.]+) CPU-hours", "two": r"about ([\d.]+) hours on 2 cores",
        "warm": r"the chapters alone take about ([\d.]+) CPU-hours"}.items()}
    chapters, _ = bs.read_chapters(ROOT / "results" / "paper")
    models = {f: s for c in chapters for f, s in c.models.items()}
    own = sum(c.own for c in chapters)
    two_cores = bs.models_as_tasks(chapters, 2, fresh=True)[0]
    computed = {"fresh": (own + sum(models.values())) / 3600, "two": two_cores / 3600, "warm": own / 3600}
    assert said == {k: round(v, 1) for k, v in computed.items()}
    assert round(computed["fresh"] + 360 / 3600, 1) != said["fresh"]
