"""The trained-model store (attention_dynamics.artifacts) and files written whole
(attention_dynamics.files)."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import torch

from attention_dynamics import artifacts
from attention_dynamics.artifacts import load_or_make, models_used
from attention_dynamics.files import replaced_atomically, write_json_atomic
from attention_dynamics.store import missing_seconds


def test_an_unreadable_artifact_is_made_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    calls = []

    def make():
        calls.append(1)
        return {"x": torch.arange(3)}

    payload, prov = load_or_make("test", {"a": 1}, make, modules=["attention_dynamics.stats"])
    assert not prov["loaded"] and payload["x"].tolist() == [0, 1, 2]
    Path(prov["path"]).write_bytes(b"truncated")
    payload, prov = load_or_make("test", {"a": 1}, make, modules=["attention_dynamics.stats"])
    assert len(calls) == 2 and not prov["loaded"] and "does not load" in capsys.readouterr().err
    assert load_or_make("test", {"a": 1}, make, modules=["attention_dynamics.stats"])[1]["loaded"]
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_the_models_a_process_used_are_listed_with_their_training_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    monkeypatch.setattr(artifacts, "_used", {})
    _, made = load_or_make("used", {"a": 1}, lambda: {"x": 1}, modules=["attention_dynamics.stats"])
    _, loaded = load_or_make("used", {"a": 1}, lambda: {"x": 1}, modules=["attention_dynamics.stats"])
    (entry,) = models_used()
    # asked for twice, trained by the first call: one model, trained here, its seconds as made
    assert entry == {"file": Path(made["path"]).name, "seconds": made["seconds"], "loaded": False}
    assert loaded["loaded"] and not made["loaded"]
    # another process (a fresh list) that finds it stored loaded it
    monkeypatch.setattr(artifacts, "_used", {})
    load_or_make("used", {"a": 1}, lambda: {"x": 1}, modules=["attention_dynamics.stats"])
    assert models_used() == [dict(entry, loaded=True)]


def test_missing_seconds_counts_only_the_models_not_in_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    (tmp_path / "here.pt").write_bytes(b"x")
    models = [{"file": "here.pt", "seconds": 30.0, "loaded": True},
              {"file": "gone.pt", "seconds": 50.0, "loaded": True},
              {"file": "gone-too.pt", "seconds": 7.0, "loaded": False}]
    assert missing_seconds(models) == 57.0
    assert missing_seconds([]) == 0.0
    # entries a record could hold from an older or damaged build count nothing
    assert missing_seconds(models + [{"file": "x.pt"}, "junk", {"seconds": 5.0}]) == 57.0
    assert missing_seconds({"file": "gone.pt"}) == 0.0


def test_a_file_written_atomically_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "sub" / "record.json"
    write_json_atomic(target, {"a": 1})
    assert target.read_text() == '{\n "a": 1\n}\n'
    mode = stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # an ordinary file's mode, not mkstemp's private 0600
    with pytest.raises(RuntimeError, match="half"):
        with replaced_atomically(target) as tmp:
            tmp.write_text("half a fi")
            raise RuntimeError("half written")
    # the old file stays, and no temporary is left beside it
    assert target.read_text() == '{\n "a": 1\n}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["record.json"]
    with pytest.raises(ValueError):  # NaN is refused before anything is renamed
        write_json_atomic(target, {"a": float("nan")})
    assert sorted(p.name for p in target.parent.iterdir()) == ["record.json"]


def test_the_stores_plumbing_is_outside_every_key(root):
    """A better lock or log line in the store must retrain no model and re-execute no
    chapter, while the code that computes (here the kernels' C sources) stays covered."""
    from attention_dynamics.sources import PACKAGE_DIR, chapter_modules, module_closure

    plumbing = {"artifacts.py", "files.py", "sources.py"}
    makers = sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if "load_or_make(" in p.read_text()
                    and p.stem not in ("artifacts", "files", "sources"))
    assert {"windtunnel", "windtunnel_rates", "windtunnel_ablation", "primitive_models", "causal_head", "deep_variant"} <= set(makers)
    for maker in makers:
        names = {p.relative_to(PACKAGE_DIR).as_posix() for p in module_closure([f"attention_dynamics.{maker}"])}
        assert f"{maker}.py" in names and "native/causal_head.c" in names and "training.py" in names, maker
        assert not names & plumbing, maker
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        assert not {p.name for p in chapter_modules(nb)} & plumbing, nb.stem
    # entered from nowhere else, the plumbing adds only the package it sits in
    assert [p.name for p in module_closure(["attention_dynamics.artifacts"])] == ["__init__.py"]


def test_a_module_edited_within_a_process_is_read_anew(tmp_path, monkeypatch):
    """Each module's imports are kept per process (sources._file_imports), looked up by its
    text: an import added to a file, or taken out again, changes the closure at once."""
    from attention_dynamics import sources

    pkg = tmp_path / "attention_dynamics"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("y = 2\n")
    a = pkg / "a.py"
    monkeypatch.setattr(sources, "PACKAGE_DIR", pkg)

    def closure() -> list[str]:
        return [p.name for p in sources.module_closure(["attention_dynamics.a"])]

    a.write_text("x = 1\n")
    assert closure() == ["__init__.py", "a.py"]
    a.write_text("def f():\n    from . import b\n")  # an import inside a function counts
    assert closure() == ["__init__.py", "a.py", "b.py"]
    a.write_text("x = 1\n")
    assert closure() == ["__init__.py", "a.py"]


def test_raising_the_store_format_makes_every_model_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    calls = []

    def make():
        calls.append(1)
        return {"x": 1}

    first = load_or_make("fmt", {"a": 1}, make, modules=["attention_dynamics.stats"])[1]
    assert load_or_make("fmt", {"a": 1}, make, modules=["attention_dynamics.stats"])[1]["loaded"]
    monkeypatch.setattr(artifacts, "STORE_FORMAT", 2)
    second = load_or_make("fmt", {"a": 1}, make, modules=["attention_dynamics.stats"])[1]
    assert not second["loaded"] and second["key"] != first["key"] and len(calls) == 2


def test_the_lease_for_a_shared_store_is_taken_over_from_a_dead_holder(tmp_path, monkeypatch, capsys):
    """ATTENTION_DYNAMICS_LOCK=file: an fcntl lock's file left in the store does not block
    it, and a lease whose holder died (a process killed mid-training, on any machine) is
    taken over once it expires, after saying it waits."""
    import socket
    import subprocess
    import sys

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    load_or_make("lk", {"a": 1}, lambda: {"x": 1}, modules=["attention_dynamics.stats"])  # default: fcntl
    monkeypatch.setenv("ATTENTION_DYNAMICS_LOCK", "file")
    monkeypatch.setattr(artifacts, "LEASE_SECONDS", 1.0)
    assert load_or_make("lk", {"a": 1}, lambda: {"x": 2}, modules=["attention_dynamics.stats"])[0] == {"x": 1}
    assert not capsys.readouterr().err  # no wait: the old lock file is another file
    name = next(p.name for p in tmp_path.iterdir() if p.suffix == ".pt")
    lease = tmp_path / f".{name}.lease"
    holder = ("import os, sys\nfrom filelock import SoftFileLease\n"
              "held = SoftFileLease(sys.argv[1], lease_duration=1.0, heartbeat_interval=0.25)\n"
              "held.acquire()\nos._exit(0)")  # killed while holding it (a dropped lock object releases)
    subprocess.run([sys.executable, "-c", holder, str(lease)], check=True)
    assert lease.exists()  # the dead holder's claim
    # as if it had died on another machine: no process to look for, the lease must expire
    lease.write_text(lease.read_text().replace(f"host={socket.gethostname()}", "host=elsewhere"))
    start = time.perf_counter()
    assert load_or_make("lk", {"a": 1}, lambda: {"x": 2}, modules=["attention_dynamics.stats"])[0] == {"x": 1}
    assert "waiting for it" in capsys.readouterr().err and time.perf_counter() - start < 30
    monkeypatch.setenv("ATTENTION_DYNAMICS_LOCK", "nfs")
    with pytest.raises(ValueError, match="ATTENTION_DYNAMICS_LOCK must be 'os' or 'file', got 'nfs'"):
        load_or_make("lk", {"a": 1}, lambda: {"x": 1}, modules=["attention_dynamics.stats"])
