"""Shared fixtures: chapters executed once per session at the quick profile."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from attention_dynamics.book.profiles import find_root
from attention_dynamics.book.runner import execute, make_jobs

ROOT = Path(__file__).resolve().parents[1]
# Figures of the library's own tests (not the notebooks') need no screen.
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def root() -> Path:
    return find_root(ROOT)


@pytest.fixture(scope="session")
def quick_runs(tmp_path_factory, root):
    """chapter name -> its record (values + provenance), each chapter executed once."""
    out = tmp_path_factory.mktemp("chapters")
    cache: dict[str, dict] = {}

    def run(name: str) -> dict:
        if name not in cache:
            (job,) = make_jobs(root, "quick", only=[name], out_dir=out)
            cache[name] = execute(job).record
        return cache[name]

    run.out_dir = out
    return run
