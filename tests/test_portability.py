"""What a reader on another system meets: the artifact lock without fcntl (Windows), make.py
on an older Python and without os.geteuid, and the browser found where it is installed."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _make():
    spec = importlib.util.spec_from_file_location("make_under_test", ROOT / "make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Each of two processes, with fcntl made unimportable (as on Windows), asks for the same
# artifact; make() is slow, so both are inside load_or_make() at once.
NO_FCNTL = textwrap.dedent("""
    import sys, time, os, json
    sys.modules["fcntl"] = None  # import fcntl now raises ImportError, as on Windows
    import filelock
    from attention_dynamics.artifacts import load_or_make
    log = sys.argv[1]

    def make():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.5)
        return {"maker": os.getpid()}

    payload, prov = load_or_make("lockprobe", {"n": 1}, make, modules=["attention_dynamics.artifacts"])
    print(json.dumps({"lock": filelock.FileLock.__name__, "maker": payload["maker"], "loaded": prov["loaded"]}))
""")


def test_the_artifact_lock_works_without_fcntl(tmp_path):
    env = dict(os.environ, ATTENTION_DYNAMICS_ARTIFACTS=str(tmp_path / "store"))
    log = tmp_path / "makers.txt"
    procs = [subprocess.Popen([sys.executable, "-c", NO_FCNTL, str(log)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-1500:] for _, e in outs]
    import json

    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert {r["lock"] for r in results} == {"SoftFileLock"}  # the fallback, not fcntl
    assert len(log.read_text().split()) == 1  # made once
    assert results[0]["maker"] == results[1]["maker"] and sorted(r["loaded"] for r in results) == [False, True]


@pytest.mark.parametrize("version", [(3, 10, 14), (3, 9, 0)])
def test_make_stops_with_one_line_on_an_older_python(version):
    probe = (f"import runpy, sys; sys.version_info = {version!r}; sys.argv = ['make.py', 'test']; "
             f"runpy.run_path({str(ROOT / 'make.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("make.py: Python 3.11 or newer is needed") \
        and f"this is Python {'.'.join(map(str, version))}" in lines[0]


def test_make_accepts_this_python():
    _make().check_python()  # no exit
    _make().check_python((3, 11, 0))


def test_make_knows_it_is_not_root_where_there_is_no_geteuid(monkeypatch):
    make = _make()
    monkeypatch.delattr(os, "geteuid", raising=False)
    assert make.is_root() is False


def test_the_browser_is_found_where_the_environment_says(monkeypatch, tmp_path):
    make = _make()
    chrome, driver = tmp_path / "my-chrome", tmp_path / "my-driver"
    monkeypatch.setenv("CHROME_BIN", str(chrome))
    monkeypatch.setenv("CHROMEDRIVER", str(driver))
    assert make.find_browser() is None  # named but not there
    chrome.write_text(""), driver.write_text("")
    assert make.find_browser() == (str(chrome), str(driver))


def test_requires_python_says_what_the_pins_need():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == ">=" + ".".join(map(str, _make().MIN_PYTHON))
