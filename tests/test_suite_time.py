"""benchmarks/suite_time.py's arithmetic on cases solved by hand, and the times the quick
book's process notes for it (tests/suite_times.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("suite_time", ROOT / "benchmarks" / "suite_time.py")
st = importlib.util.module_from_spec(spec)
spec.loader.exec_module(st)


def test_the_bound_is_the_work_over_the_cpus_and_idle_is_what_they_did_not_do():
    assert st.bounds(100.0, 200.0, 2) == {"bound": 100.0, "idle": 0.0}  # both CPUs busy all along
    assert st.bounds(100.0, 120.0, 2) == {"bound": 60.0, "idle": 80.0}  # one idle most of the time
    assert st.bounds(100.0, 100.0, 1) == {"bound": 100.0, "idle": 0.0}
    assert st.bounds(100.0, 250.0, 2)["idle"] == -50.0  # not clamped: more work than 2 CPUs can do says so
    for wall, work, cpus in ((0.0, 1.0, 2), (1.0, -1.0, 2), (1.0, 1.0, 0)):
        with pytest.raises(ValueError, match="wall must be > 0, work >= 0 and cpus >= 1"):
            st.bounds(wall, work, cpus)


# a child that spins for about 0.3 CPU seconds
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def test_busy_cpus_are_the_busy_share_of_each_stretch_weighted_by_time():
    # 2 CPUs, 100 jiffies a second in all: fully busy for 2 s, then half, then idle for 2 s
    samples = [(0.0, 0, 0), (1.0, 100, 100), (2.0, 200, 200), (3.0, 250, 300), (4.0, 300, 400),
               (5.0, 300, 500), (6.0, 300, 600)]
    assert st.busy_cpus(samples, 2, 2.0) == [(0.0, 2.0), (2.0, 1.0), (4.0, 0.0)]
    # a stretch of unequal samples: 1 s fully busy and 3 s idle average to a quarter of 2 CPUs
    uneven = [(0.0, 0, 0), (1.0, 100, 100), (4.0, 100, 400)]
    assert st.busy_cpus(uneven, 2, 10.0) == [(0.0, 0.5)]
    # an interval across a boundary is shared by time: 1.5-2.5 s fully busy, the rest idle
    across = [(0.0, 0, 0), (1.5, 0, 150), (2.5, 100, 250), (4.0, 100, 400)]
    assert st.busy_cpus(across, 2, 2.0) == [(0.0, 0.5), (2.0, 0.5)]
    # stretches of a tenth of a second: each its own, none lost or doubled by float division
    tenths = st.busy_cpus([(0.0, 0, 0), (0.3, 30, 30)], 1, 0.1)
    assert [k for k, _ in tenths] == pytest.approx([0.0, 0.1, 0.2]) and [v for _, v in tenths] == pytest.approx([1.0] * 3)


def test_the_work_of_each_test_file_is_the_sum_of_its_tests_the_most_first():
    # the file with the most work has the fewest tests and seconds, a later name, and comes
    # last: an order by anything but the summed work, or none, fails; b and c tie on work
    tests = [{"id": "tests/test_a.py::one", "start": 0.0, "end": 3.0, "cpu": 1.0, "children": 0.0},
             {"id": "tests/test_a.py::two", "start": 3.0, "end": 9.0, "cpu": 0.5, "children": 0.5},
             {"id": "tests/test_c.py::three", "start": 9.0, "end": 9.5, "cpu": 0.25, "children": 0.25},
             {"id": "tests/test_b.py::four", "start": 9.5, "end": 10.0, "cpu": 0.5, "children": 0.0},
             {"id": "tests/test_z.py::five[1]", "start": 10.0, "end": 11.0, "cpu": 0.5, "children": 9.5}]
    assert st.work_by_file(tests) == [("tests/test_z.py", 1, 1.0, 0.5, 9.5), ("tests/test_a.py", 2, 9.0, 1.5, 0.5),
                                      ("tests/test_b.py", 1, 0.5, 0.5, 0.0), ("tests/test_c.py", 1, 0.5, 0.25, 0.25)]


def test_the_plugin_charges_a_child_to_the_test_that_collected_it(tmp_path):
    """A child spinning about 0.3 CPU seconds, run and waited for in one test, is in that
    test's children and not in the next test's, nor in either's own work."""
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys\n"
        "def test_spins():\n"
        f"    subprocess.run([sys.executable, '-c', {SPIN!r}], check=True)\n"
        "def test_idle():\n"
        "    pass\n")
    log = tmp_path / "tests.jsonl"
    env = dict(os.environ, SUITE_TIME_TESTS=str(log), PYTHONPATH=str(ROOT / "benchmarks"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_time_plugin",
                           "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_spin.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {json.loads(l)["id"].split("::")[1]: json.loads(l) for l in log.read_text().splitlines()}
    assert rows["test_spins"]["children"] >= 0.3  # the child's own CPU time, at least what it spun
    assert rows["test_idle"]["children"] == 0.0
    assert rows["test_spins"]["cpu"] < 0.3  # the wait is not the pytest process's work


def test_each_phase_of_the_book_is_noted_once(tmp_path):
    path = tmp_path / "book.jsonl"
    rows = [{"phase": "book", "time": 110.0, "cpu": 50.0}, {"phase": "leg", "time": 130.0, "cpu": 90.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert st.read_book_times(path, 100.0) == {"book": {"at": 10.0, "cpu": 50.0}, "leg": {"at": 30.0, "cpu": 90.0}}
    assert st.read_book_times(tmp_path / "none.jsonl", 100.0) == {}
    # a second process noting its own phases (the leg, had it kept the variable) is refused
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [{"phase": "book", "time": 112.0, "cpu": 5.0}]))
    with pytest.raises(ValueError, match="'book' is noted twice"):
        st.read_book_times(path, 100.0)


def test_the_book_process_notes_its_phases_and_their_work_only_where_asked(tmp_path):
    """note_time counts the children it has waited for: a child that spun for about 0.3 CPU
    seconds is in the second note and not the first; without the variable nothing is written."""
    path = tmp_path / "times.jsonl"
    code = ("import sys, subprocess; sys.path.insert(0, sys.argv[1]); import suite_times as q; q.note_time('book'); "
            f"subprocess.run([sys.executable, '-c', {SPIN!r}]); q.note_time('leg')")
    env_with = {"ATTENTION_DYNAMICS_SUITE_TIMES": str(path)}
    subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], check=True, env={**os.environ, **env_with})
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["book", "leg"]
    assert rows[1]["cpu"] - rows[0]["cpu"] >= 0.3 and rows[1]["time"] >= rows[0]["time"]
    path.unlink()
    env_without = {k: v for k, v in os.environ.items() if k != "ATTENTION_DYNAMICS_SUITE_TIMES"}
    subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], check=True, env=env_without)
    assert not path.exists()


def test_the_leg_runs_without_the_variable_and_its_time_is_noted_by_the_book(tmp_path, monkeypatch):
    """quick_book.main notes start, book and leg itself, and starts the leg (which would note
    its own phases) without ATTENTION_DYNAMICS_SUITE_TIMES and with every kernel off."""
    import quick_book

    record = {"record": {"provenance": {"paths": {"causal_head": "kernel (native)"}}}, "planned": [], "planned_failed": []}
    monkeypatch.setattr(quick_book, "run", lambda root, out, results, names: {"sticky_chain": record})
    legs = []
    monkeypatch.setattr(quick_book.subprocess, "run",
                        lambda cmd, **kw: legs.append(kw["env"]) or subprocess.CompletedProcess(cmd, 0))
    times = tmp_path / "times.jsonl"
    monkeypatch.setenv("ATTENTION_DYNAMICS_SUITE_TIMES", str(times))
    with pytest.raises(SystemExit) as ended:
        quick_book.main(["root", "out", "results", "sticky_chain", "--then-without-kernels", "out2", "results2"])
    assert ended.value.code == 0
    (env,) = legs
    assert "ATTENTION_DYNAMICS_SUITE_TIMES" not in env and env["ATTENTION_DYNAMICS_NATIVE"] == "0"
    assert [json.loads(l)["phase"] for l in times.read_text().splitlines()] == ["start", "book", "leg"]


def test_the_benchmark_runs_pytest_and_prints_its_time_and_work():
    """End to end, on a selection that reads no chapter: pytest's own exit status, the wall
    clock, the work, the bound, and that no quick book ran."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_time.py"), "--every", "1", "--",
                           "tests/test_suite_time.py", "-k", "bound_is_the_work"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in ("1 passed", "wall clock", "work ", "bound: work / CPUs", "no quick book ran beside the tests",
                 "the longest tests", "test_the_bound_is_the_work_over_the_cpus_and_idle_is_what_they_did_not_do"):
        assert line in done.stdout, (line, done.stdout[-3000:])
