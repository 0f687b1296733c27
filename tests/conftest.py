"""Shared fixtures: chapters executed once per session at the quick profile."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from attention_dynamics.book.profiles import find_root
from attention_dynamics.book.profiles import load_profiles
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.scheduling import run_chapters

ROOT = Path(__file__).resolve().parents[1]
# Figures of the library's own tests (not the notebooks') need no screen.
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session", autouse=True)
def artifact_store(tmp_path_factory) -> Path:
    """Trained models the chapters share (attention_dynamics.artifacts) go to a folder of
    this test run, shared by its xdist workers, so that no test loads what an earlier run or
    the book build stored."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "artifacts"
    folder.mkdir(exist_ok=True)
    os.environ["ATTENTION_DYNAMICS_ARTIFACTS"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def root() -> Path:
    return find_root(ROOT)


@pytest.fixture(scope="session")
def quick_runs(request, tmp_path_factory, root):
    """chapter name -> its record (values + provenance), each chapter executed once. At
    the first call, every chapter the selected tests need is executed, side by side on the
    machine's cores (the runner's own scheduling: longest first, one thread each): the
    chapter of each test_<chapter>_chapter, and all of them when a selected test reads
    every chapter."""
    out = tmp_path_factory.mktemp("chapters")
    cache: dict[str, dict] = {}
    names = list(load_profiles(root))

    def needed() -> list[str]:
        want = set()
        for item in request.session.items:
            if "quick_runs" not in getattr(item, "fixturenames", ()):
                continue
            own = item.name.removeprefix("test_").removesuffix("_chapter")
            want |= {own} if item.name.endswith("_chapter") and own in names else set(names)
        return [n for n in names if n in want]

    def run(name: str) -> dict:
        if name not in cache:
            todo = [n for n in dict.fromkeys(needed() + [name]) if n not in cache]
            for r in run_chapters(make_jobs(root, "quick", only=todo, out_dir=out), progress=False):
                cache[r.name] = r.record
                run.planned[r.name] = (r.planned, r.planned_failed)
        return cache[name]

    run.planned = {}  # chapter -> the stored models its plan made first, its failed tasks (book.plans)

    run.out_dir = out
    return run
