"""Shared fixtures: chapters executed once per session at the quick profile."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_dynamics.book.profiles import find_root
from attention_dynamics.book.profiles import load_profiles
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.scheduling import run_chapters
from support import environ_restored

ROOT = Path(__file__).resolve().parents[1]
# Figures of the library's own tests (not the notebooks') need no screen.
os.environ.setdefault("MPLBACKEND", "Agg")


def _reads_the_book(item) -> bool:
    return "quick_runs" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The tests that read the quick book run last (each module's in their order), so that
    the others run while the book is executed beside them (quick_runs)."""
    items.sort(key=_reads_the_book)


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


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test leaves the process environment as it found it (support.environ_restored)."""
    with environ_restored():
        yield


@pytest.fixture(scope="session")
def root() -> Path:
    return find_root(ROOT)


def _needed(session, names: list[str]) -> list[str]:
    """The chapters the selected tests read: the chapter of each test_<chapter>_chapter, and
    all of them when a selected test reads every chapter."""
    want = set()
    for item in session.items:
        if not _reads_the_book(item):
            continue
        own = item.name.removeprefix("test_").removesuffix("_chapter")
        want |= {own} if item.name.endswith("_chapter") and own in names else set(names)
    return [n for n in names if n in want]


# its chapters without kernels run in the quick book's process too, right after the book
WITHOUT_KERNELS_TEST = "test_the_pytorch_paths_give_every_chapter_the_same_claims"
# The session's own tests run one after another and end the suite, the book beside them has
# time to spare (benchmarks/suite_time.py on 2 CPUs, AMD EPYC 25/1: at nice 0 the tests ran
# 157 s after the book had ended, alone on one core; at nice 10, 4-32 s): the book yields.
# Nice 10 weighs 110 against a test's 1024, so a test that wants a core gets nine tenths of
# it, and the book every cycle the tests leave.
BOOK_NICENESS = 10


@pytest.fixture(scope="session", autouse=True)
def _quick_book_beside(request, tmp_path_factory, artifact_store):
    """At the session's first test, the chapters the selected tests will read start in a
    process of their own (quick_book.py), with the session's environment as it is now: the
    tests that do not read them run meanwhile, on the cores the book leaves. None when no
    selected test reads a chapter."""
    root = find_root(ROOT)
    names = _needed(request.session, list(load_profiles(root)))
    if not names or os.environ.get("PYTEST_XDIST_WORKER"):  # each worker would start the whole book
        yield None
        return
    out, results = tmp_path_factory.mktemp("chapters"), tmp_path_factory.mktemp("quick-book") / "results.json"
    cmd = [sys.executable, str(ROOT / "tests" / "quick_book.py"), "--stop-with-stdin", "--nice", str(BOOK_NICENESS),
           str(root), str(out), str(results), *names]
    leg = None
    if any(item.name == WITHOUT_KERNELS_TEST for item in request.session.items):
        leg = (tmp_path_factory.mktemp("chapters-pytorch"), results.with_name("without-kernels.json"))
        cmd += ["--then-without-kernels", *map(str, leg)]
    log = open(results.with_name("log.txt"), "w+")
    # One PyTorch thread here while the book's two workers share the cores: with two, each of
    # this process's parallel regions waited on a thread the book had descheduled
    # (test_the_tuned_comparison_can_say_ahead_and_same took 78 s instead of 15 s).
    import torch

    torch.set_num_threads(1)
    # its stdin stays open while the session lives: at its end, however it ends, the book stops
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    book = {"names": names, "out": out, "results": results, "without_kernels": leg, "proc": proc, "log": log,
            "shown": False}
    yield book
    if proc.poll() is None:  # the session ended (or stopped) before it needed the book
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    proc.stdin.close()
    log.close()


@pytest.fixture(scope="session")
def quick_runs(request, tmp_path_factory, _quick_book_beside):
    """chapter name -> its record (values + provenance), each chapter executed once: those
    the selected tests read by the process started at the session's start (side by side on
    the machine's cores, the runner's own scheduling: longest first, one thread each); with
    no such process (an xdist worker), those and any other here, at the first call."""
    book = _quick_book_beside
    out = book["out"] if book else tmp_path_factory.mktemp("chapters")
    cache: dict[str, dict] = {}

    def book_failed(what: str) -> RuntimeError:
        book["log"].seek(0)
        return RuntimeError(f"{what} failed (exit status {book['proc'].returncode}):\n{book['log'].read()[-6000:]}")

    def wait_for_the_book() -> None:
        """Until the book's records are written (whole, once every chapter has run), not until
        its process ends: the chapters without kernels may still be running after them."""
        while not book["results"].is_file() and book["proc"].poll() is None:
            time.sleep(0.5)
        if not book["results"].is_file():
            raise book_failed(f"the quick book ({', '.join(book['names'])})")
        if not book["shown"]:  # the runner's warnings, in the first reading test's output
            book["log"].seek(0)
            print(book["log"].read())
            book["shown"] = True
        for name, r in json.loads(book["results"].read_text()).items():
            cache[name] = r["record"]
            run.planned[name] = (tuple(r["planned"]), tuple(r["planned_failed"]))

    def run(name: str) -> dict:
        if name not in cache and book and name in book["names"]:
            wait_for_the_book()
        if name not in cache:
            names = list(load_profiles(find_root(ROOT)))
            todo = [n for n in dict.fromkeys(_needed(request.session, names) + [name]) if n not in cache]
            for r in run_chapters(make_jobs(find_root(ROOT), "quick", only=todo, out_dir=out), progress=False):
                cache[r.name] = r.record
                run.planned[r.name] = (r.planned, r.planned_failed)
        return cache[name]

    def without_kernels() -> dict[str, dict]:
        """The chapters that ran a compiled kernel here, executed again with every kernel off
        (ATTENTION_DYNAMICS_NATIVE=0): chapter name -> its record (none when no kernel ran)."""
        if not (book and book["without_kernels"]):
            raise RuntimeError(f"the chapters without kernels are run for {WITHOUT_KERNELS_TEST} only")
        wait_for_the_book()
        book["proc"].wait()
        if not book["without_kernels"][1].is_file():
            raise book_failed("the chapters without kernels")
        return {name: r["record"] for name, r in json.loads(book["without_kernels"][1].read_text()).items()}

    run.planned = {}  # chapter -> the stored models its plan made first, its failed tasks (book.plans)
    run.without_kernels = without_kernels

    run.out_dir = out
    return run
