"""The runner under bad input, faults and interruption: one-line errors that name the
argument or file, no half-written outputs, a cache that verifies what it trusts."""
from __future__ import annotations

import json
import os
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor

import nbformat
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_dynamics.book import cli, scheduling
from attention_dynamics.book.profiles import format_value, parse_value
from attention_dynamics.book.cli import main
from attention_dynamics.book.execution import execute
from attention_dynamics.book.jobs import NotebookFailed, make_grid_jobs, make_jobs
from attention_dynamics.book.scheduling import run_jobs
from support import TINY_CELLS, footer_commands, forked_kernels, loading, make_root, papermill_parameters

def run_main(monkeypatch, capsys, root, *argv):
    """The command line, from the root of a (temporary) repository."""
    monkeypatch.chdir(root)
    monkeypatch.setattr(cli, "find_root", lambda start=None: root)
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


# --- 1. values round-trip through --set, --grid, profiles.yml and the printed commands ---

values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12)
    | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4), max_leaves=10)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values)
def test_every_value_round_trips_through_both_parsers(v):
    text = format_value(v)
    assert parse_value(text) == v  # the runner's --set / --grid
    assert yaml.safe_load(text) == v  # papermill's -y (plain YAML 1.1)


@pytest.mark.parametrize("text, value", [("1e-05", 1e-05), ("2E3", 2000.0), ("1.5e3", 1500.0), ("-3e-2", -0.03),
                                         ("1.0e-05", 1e-05), ("7", 7), ("0.5", 0.5), ("[1e-3, 2]", [0.001, 2]),
                                         ("abc", "abc"), ('"1e-05"', "1e-05")])
def test_numbers_in_every_notation_are_numbers(text, value):
    got = parse_value(text)
    assert got == value and type(got) is type(value)


def test_set_reads_exponent_floats(tmp_path, monkeypatch, capsys):
    root = make_root(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, root, "--profile", "quick", "--only", "tiny", "--set", "x=1e-05",
                              "--out", str(tmp_path / "out"))
    assert code == 0, err
    rec = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert rec["values"]["double"] == 2e-05 and rec["provenance"]["parameters"] == {"x": 1e-05}


def test_profiles_read_exponent_floats(tmp_path):
    root = make_root(tmp_path, profiles="tiny:\n  quick: {x: 1e-05}\n  paper: {x: 5}\n")
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out")
    assert job.parameters == {"x": 1e-05}


# --- 2. a failing notebook in a process pool keeps its chapter, cell and cause ---------

def test_notebook_failure_survives_pickling():
    e = NotebookFailed("value_law--seed--1", 3, "ValueError", "seed must be ...", "Cell In[3], line 14")
    back = pickle.loads(pickle.dumps(e))
    assert (back.name, back.cell, back.ename, back.evalue, back.tail) == (e.name, e.cell, e.ename, e.evalue, e.tail)
    assert str(back) == str(e)


def test_failure_in_a_process_pool_names_chapter_and_cell_and_cleans_up(tmp_path):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    jobs = make_grid_jobs(root, "tiny", {"fail": [False, True]}, out_dir=out)
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    with ProcessPoolExecutor(max_workers=2) as pool:
        with pytest.raises(NotebookFailed, match=r"notebook 'tiny--fail-true' failed in cell In\[\d+\]: ValueError: x is broken"):
            run_jobs(jobs, pool, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["tiny--fail-false.ipynb", "tiny--fail-false.json"]
    after = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    assert not [d for d in after - before if d.startswith("tiny")]


@pytest.fixture
def held_port():
    """A local TCP port that a listening socket holds for the test."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _kernels_that_die_at_start(monkeypatch, port: int, deaths: int) -> list:
    """papermill, with the first ``deaths`` kernels given a shell port another socket
    holds: a real kernel that dies as it starts, as one does when another process takes
    its port first. Returns the list of calls, one per start."""
    import papermill as pm
    from traitlets.config import Config

    real = pm.execute_notebook
    calls: list = []

    def execute_notebook(*args, **kwargs):
        calls.append(args)
        if len(calls) <= deaths:
            # cache_ports=False: otherwise jupyter_client overwrites a configured port
            kwargs["config"] = Config({"KernelManager": {"shell_port": port, "cache_ports": False}})
        return real(*args, **kwargs)

    monkeypatch.setattr(pm, "execute_notebook", execute_notebook)
    return calls


# The runner's kernel, forked from a template (book.templates), where a notebook imports a
# library it loads first: the same faults read the same. The spy counts the forked kernels.
KERNELS = ["plain", "forked"]


def _cells(kernel: str, cells=TINY_CELLS) -> list:
    return loading(cells) if kernel == "forked" else list(cells)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernel_that_dies_as_it_starts_is_started_again(tmp_path, monkeypatch, capfd, held_port, kernel):
    root = make_root(tmp_path, _cells(kernel))
    out = tmp_path / "out"
    calls = _kernels_that_die_at_start(monkeypatch, held_port, deaths=1)
    forked = forked_kernels(monkeypatch)
    (job,) = make_jobs(root, "quick", out_dir=out)
    r = execute(job)
    assert len(calls) == 2 and r.status == "ran" and r.record["values"] == {"double": 6}
    assert len(forked) == (2 if kernel == "forked" else 0)
    err = capfd.readouterr().err
    assert "Address already in use" in err  # the first kernel's own words: it did die
    assert "note: tiny: the kernel died as it started (attempt 1 of 3; no cell had run); starting it again" in err
    assert sorted(p.name for p in out.iterdir()) == ["tiny.ipynb", "tiny.json"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernel_that_keeps_dying_and_a_failing_cell_are_not_started_again(tmp_path, monkeypatch, capfd, held_port,
                                                                           kernel):
    from attention_dynamics.book.execution import KERNEL_START_ATTEMPTS

    root = make_root(tmp_path, _cells(kernel))
    out = tmp_path / "out"
    calls = _kernels_that_die_at_start(monkeypatch, held_port, deaths=KERNEL_START_ATTEMPTS)
    forked = forked_kernels(monkeypatch)
    (job,) = make_jobs(root, "quick", out_dir=out)
    with pytest.raises(NotebookFailed, match="notebook 'tiny' failed.*Kernel died before replying to kernel_info"):
        execute(job)
    assert len(calls) == KERNEL_START_ATTEMPTS
    assert len(forked) == (KERNEL_START_ATTEMPTS if kernel == "forked" else 0)
    assert not out.exists() or list(out.iterdir()) == []
    assert capfd.readouterr().err.count("starting it again") == KERNEL_START_ATTEMPTS - 1

    monkeypatch.undo()
    calls = _kernels_that_die_at_start(monkeypatch, held_port, deaths=0)
    (job,) = make_jobs(root, "quick", out_dir=out, overrides={"fail": True})
    with pytest.raises(NotebookFailed, match=r"failed in cell In\[\d+\]: ValueError: x is broken"):
        execute(job)
    assert len(calls) == 1 and "starting it again" not in capfd.readouterr().err


@pytest.mark.parametrize("death", ["os._exit(1)", "os.kill(os.getpid(), signal.SIGKILL)"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernel_that_dies_in_a_cell_is_not_started_again(tmp_path, monkeypatch, capfd, held_port, kernel, death):
    """nbclient's DeadKernelError is a RuntimeError too, but a cell had run."""
    cells = _cells(kernel, [TINY_CELLS[0], ("code", f"import os, signal\n{death}", [])])
    root = make_root(tmp_path, cells=cells)
    calls = _kernels_that_die_at_start(monkeypatch, held_port, deaths=0)
    forked = forked_kernels(monkeypatch)
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out")
    with pytest.raises(NotebookFailed, match="notebook 'tiny' failed.*DeadKernelError"):
        execute(job)
    assert len(calls) == 1 and "starting it again" not in capfd.readouterr().err
    assert len(forked) == (1 if kernel == "forked" else 0)


def test_stale_work_folders_of_dead_runs_are_removed(tmp_path):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    dead = out / ".tiny.pid999999999.abc.running"  # no such process
    dead.mkdir()
    (job,) = make_jobs(root, "quick", out_dir=out)
    execute(job)
    assert not dead.exists() and sorted(p.name for p in out.iterdir()) == ["tiny.ipynb", "tiny.json"]


# --- 3. the cache verifies what it trusts ----------------------------------------------

def _damage_notebook_empty(out):
    (out / "tiny.ipynb").write_text("")


def _damage_notebook_truncated(out):
    text = (out / "tiny.ipynb").read_text()
    (out / "tiny.ipynb").write_text(text[: len(text) // 2])


def _damage_record_list(out):
    (out / "tiny.json").write_text("[1, 2]")


def _damage_record_provenance(out):
    rec = json.loads((out / "tiny.json").read_text())
    rec["provenance"] = "not a dict"
    (out / "tiny.json").write_text(json.dumps(rec))


def _damage_record_bytes(out):
    (out / "tiny.json").write_bytes(b"\xff\xfe\x00garbage")


def _damage_record_truncated(out):
    text = (out / "tiny.json").read_text()
    (out / "tiny.json").write_text(text[:20])


@pytest.mark.parametrize("damage", [_damage_notebook_empty, _damage_notebook_truncated, _damage_record_list,
                                    _damage_record_provenance, _damage_record_bytes, _damage_record_truncated])
def test_a_damaged_output_is_executed_again(tmp_path, damage, capsys):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    (job,) = make_jobs(root, "quick", out_dir=out)
    assert execute(job).status == "ran"
    assert execute(job).status == "cached"
    damage(out)
    r = execute(job)
    assert r.status == "ran" and r.record["values"] == {"double": 6}
    assert execute(job).status == "cached"
    assert "executing it again" in capsys.readouterr().err


# --- 4. --set applies to every grid point ------------------------------------------------

def test_set_applies_to_every_point_of_a_grid(tmp_path, monkeypatch, capsys):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    code, stdout, err = run_main(monkeypatch, capsys, root, "--profile", "quick", "--only", "tiny", "--grid", "x=[1,2]",
                                 "--set", "offset=10", "--out", str(out))
    assert code == 0, err
    got = {p.name: json.loads(p.read_text())["values"]["double"] for p in out.glob("*.json")}
    assert got == {"tiny--x-1.json": 12, "tiny--x-2.json": 14}
    code, _, err = run_main(monkeypatch, capsys, root, "--profile", "quick", "--only", "tiny", "--grid", "x=[1,2]",
                            "--set", "x=3", "--out", str(out))
    assert code == 1 and "set by both --set and --grid" in err


# --- 6. one line where a traceback used to be --------------------------------------------

def _one_error_line(err: str) -> str:
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1 or (len(lines) == 2 and lines[0].startswith("usage")) or lines[-1].startswith(
        "python -m attention_dynamics.book: error"), err
    return lines[-1]


@pytest.mark.parametrize("argv, message", [
    (["--only", "tiny", "--out", "afile"], "is a file, not a folder"),
    (["--only", "tiny", "--out", "afile/sub"], "which is a file, not a folder"),
    (["--only", "tiny", "--set", "x=[1,"], "--set x: cannot read '[1,' as a YAML value"),
    (["--only", "tiny", "--grid", "x=[1,"], "--grid x: cannot read '[1,' as a YAML value"),
    (["--only", "tiny", "--grid", "x=[0,0]"], "--grid x lists the value(s) 0 more than once"),
    (["--only", "tiny", "--grid", "x=3"], "--grid x must be a non-empty YAML list"),
    (["--only", "tiny", "--grid", "x=[0,1]", "--workers", "0"], "--workers must be at least 1, got 0"),
    (["--only", "tiny", "--grid", "x=[0,1]", "--workers", "-3"], "--workers must be at least 1, got -3"),
    (["--only", "tiny", "--set", "x"], "--set takes NAME=VALUE, got 'x'"),
    (["--only", "tiny", "--set", "nope=1"], "chapter 'tiny' has no parameter(s) ['nope']"),
])
def test_bad_command_lines_get_one_line(tmp_path, monkeypatch, capsys, argv, message):
    root = make_root(tmp_path)
    (root / "afile").write_text("")
    code, _, err = run_main(monkeypatch, capsys, root, "--profile", "quick", *argv)
    assert code in (1, 2)
    line = _one_error_line(err)
    assert message in line
    assert not (root / "book").exists()


@pytest.mark.parametrize("text, message", [
    ("", "notebooks/profiles.yml is empty"),
    ("- a\n- b\n", "must map chapter names to their profiles, got a list"),
    ("tiny:\n  quick:\n  paper: {x: 5}\n", "profile 'quick' of chapter 'tiny' must map parameter names to values"),
    ("tiny: {quick: {x: 1}, paper: [1]}\n", "profile 'paper' of chapter 'tiny' must map parameter names to values"),
    ("tiny: [1, 2]\n", "chapter 'tiny' must map the profiles"),
    ("tiny: {quick: {x: 1}, paper: {x: 2}\n", "is not valid YAML at line 2, column 1"),
    ("tiny: {quick: {x: 1}}\n", "lacks the profile(s) ['paper']"),
])
def test_malformed_profiles_get_one_line(tmp_path, monkeypatch, capsys, text, message):
    root = make_root(tmp_path, profiles=text)
    code, _, err = run_main(monkeypatch, capsys, root, "--profile", "quick", "--out", str(tmp_path / "out"))
    assert code == 1 and message in _one_error_line(err)


def test_non_utf8_profiles_get_one_line(tmp_path, monkeypatch, capsys):
    root = make_root(tmp_path)
    (root / "notebooks" / "profiles.yml").write_bytes(b"tiny: \xff\xfe\n")
    code, _, err = run_main(monkeypatch, capsys, root, "--profile", "quick")
    assert code == 1 and "not UTF-8 text" in _one_error_line(err)


def test_unreachable_scheduler_fails_fast_with_its_address(tmp_path, monkeypatch, capsys):
    import time

    root = make_root(tmp_path)
    monkeypatch.setattr(scheduling, "SCHEDULER_TIMEOUT_S", 2)
    start = time.perf_counter()
    code, _, err = run_main(monkeypatch, capsys, root, "--profile", "quick", "--only", "tiny", "--grid", "x=[0,1]",
                            "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path / "out"))
    assert code == 1 and time.perf_counter() - start < 20
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 2 s" in _one_error_line(err)


# --- 8. what the user sees ---------------------------------------------------------------

def test_quiet_kernel_one_line_per_chapter_and_ordinary_file_modes(tmp_path, monkeypatch, capfd):
    """capfd: the kernel is a child process writing to the terminal's file descriptors."""
    root = make_root(tmp_path)
    out = tmp_path / "out"
    code, stdout, err = run_main(monkeypatch, capfd, root, "--profile", "quick", "--only", "tiny", "--out", str(out))
    assert code == 0
    assert "without encryption" not in err and err.strip() == ""
    progress = [l for l in stdout.splitlines() if l.startswith("[")]
    assert progress == [progress[0]] and progress[0].startswith("[1/1] tiny: ran in")
    umask = os.umask(0)
    os.umask(umask)
    for name in ("tiny.json", "tiny.ipynb"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_per_cell_progress_bar_on_a_terminal(tmp_path, capsys):
    root = make_root(tmp_path)
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out")
    execute(job, progress_bar=True)
    err = capsys.readouterr().err
    assert "tiny" in err and "cell" in err  # tqdm's bar: "tiny: 100%|...| 4/4 [..., cell/s]"


# --- the footers' commands run as printed ------------------------------------------------

def test_footer_commands_of_a_run_with_exponent_floats_run_as_printed(tmp_path, monkeypatch):
    import subprocess

    root = make_root(tmp_path)
    out = tmp_path / "out"
    (job,) = make_jobs(root, "quick", out_dir=out, overrides={"x": 1e-05, "offset": 2.5e-3})
    execute(job)
    run_cmd, pm_cmd = footer_commands(out / "tiny.ipynb")
    assert run_cmd[0] == ".venv/bin/python" and run_cmd[-2:] == ["--out", "my-runs"]
    # the runner command, as printed, finds the very run it describes (same parameters,
    # same cache key) in its --out folder
    work = tmp_path / "cwd"
    (work / "my-runs").mkdir(parents=True)
    for name in ("tiny.ipynb", "tiny.json"):
        (work / "my-runs" / name).write_bytes((out / name).read_bytes())
    monkeypatch.setattr(cli, "find_root", lambda start=None: root)
    monkeypatch.chdir(work)
    assert main(run_cmd[3:]) == 0
    assert json.loads((work / "my-runs" / "tiny.json").read_text())["provenance"]["executed_at"] == \
        json.loads((out / "tiny.json").read_text())["provenance"]["executed_at"]  # cached: not executed again
    # the papermill command, parsed by papermill itself, gives the same parameters
    assert papermill_parameters(pm_cmd, monkeypatch) == {"x": 1e-05, "offset": 2.5e-3, "profile": "quick"}
    # and runs
    monkeypatch.chdir(root)
    pm_bin = os.path.join(os.path.dirname(sys.executable), "papermill")
    done = subprocess.run([pm_bin, *pm_cmd[1:]], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    done_nb = nbformat.read(root / "tiny.ipynb", as_version=4)
    (injected,) = [c for c in done_nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert "x = 1e-05" in injected.source and "offset = 0.0025" in injected.source
