"""Running many chapters: one after another, side by side on a local process pool (longest
first, the threads shared out), on any concurrent.futures executor, or on a Dask cluster
(the book's chapters longest first, or a grid); the first failure stops the rest.

On a cluster every worker needs the same environment and the repository at a path it can
read and write (the outputs and the records are written where the job says), and the
trained-model store (``ATTENTION_DYNAMICS_ARTIFACTS``) on a path all workers share. Each
worker's kernels use the threads its environment sets (``OMP_NUM_THREADS``)."""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from concurrent.futures import Executor
from pathlib import Path

from ..store import missing_seconds, own_seconds
from .jobs import RESULTS, Job, JobResult
from .dispatch import Dispatch, one_after_another
from .kernel import carry_into_session, usable_cpus

__all__ = ["usable_cpus", "expected_seconds", "longest_first", "run_chapters", "run_jobs", "run_grid",
           "dask_executor", "local_workers", "lower_priority", "malloc_trim_warning", "SCHEDULER_TIMEOUT_S"]


def lower_priority(steps: int) -> int:
    """This process ``steps`` nicer, and its autogroup where it leads a session of its own
    (what it starts inherits the niceness; its kernels carry it into their sessions:
    :func:`attention_dynamics.book.kernel.carry_into_session`); the niceness it has now."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 19:
        raise ValueError(f"steps must be an integer from 1 to 19 (the range of niceness), got {steps!r}")
    os.nice(steps)
    carry_into_session(0, "the runner")
    return os.getpriority(os.PRIO_PROCESS, 0)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# Event loops a forked worker inherited, held so that no garbage collection closes them:
# closing one in the worker would unregister its wake-up pipe from the epoll instance it
# shares with the runner, whose loop would then never wake from another thread again.
_inherited_loops: list = []


def _fresh_event_loop() -> None:
    """In a forked worker: the event loop jupyter_core's ``run_sync`` keeps per thread
    (papermill and jupyter_client run on it) set aside, so that the worker's first chapter
    makes its own. The inherited one shares the runner's epoll instance, and its default
    executor counts idle threads the fork did not copy: a call to it (``asyncio.to_thread``,
    ``run_in_executor``) would wait for ever (tests/test_runner.py). Set aside, not closed
    (see :data:`_inherited_loops`)."""
    import asyncio

    from jupyter_core import utils

    # jupyter_core's own (private, hence looked up with care): ensure_event_loop makes a loop
    # where _loop holds None; a run_sync inside a running loop hands its work to a runner's
    # loop, whose thread the fork did not copy
    kept = getattr(utils, "_loop", None)
    runners = getattr(utils, "_runner_map", None)
    local = getattr(asyncio.get_event_loop_policy(), "_local", None)
    inherited = [kept.get() if kept is not None else None, getattr(local, "_loop", None),
                 *(runners.values() if isinstance(runners, dict) else ())]
    _inherited_loops.extend(x for x in inherited if x is not None)
    if kept is not None:
        kept.set(None)
    if isinstance(runners, dict):
        runners.clear()
    asyncio.set_event_loop(None)


def _use_threads(threads: int) -> None:
    """In a worker: a fresh event loop (:func:`_fresh_event_loop`); the kernels it starts (and
    their PyTorch) use this many threads, and so does the worker itself where it makes a
    planned model (a forked worker inherits the runner's PyTorch with its thread count
    already set)."""
    _fresh_event_loop()
    for var in THREAD_VARIABLES:
        os.environ[var] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def expected_seconds(job: Job) -> float:
    """How long the chapter will take, from its last run (its record in the output folder,
    else, paper profile, the committed paper record; 0 when neither says): that run's own
    seconds, without the models it trained then, plus the training seconds of the stored
    models it used that are not in the store now (a fresh store, or a change to the code
    that makes them)."""
    for path in (job.record, Path(job.root) / RESULTS / f"{job.name}.json"):
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        prov = record.get("provenance", {})
        if prov.get("profile") == job.profile and isinstance(prov.get("seconds"), (int, float)):
            return own_seconds(prov) + missing_seconds(prov.get("models"))
    return 0.0


def longest_first(jobs: list[Job]) -> list[Job]:
    """The jobs by the time their last run took, longest first (stable for ties)."""
    return sorted(jobs, key=expected_seconds, reverse=True)


def local_workers(workers: int | None, n_jobs: int) -> int:
    """How many chapters a local run puts side by side: ``workers`` (default one per usable
    CPU), at most one per chapter."""
    return min(workers or usable_cpus(), max(n_jobs, 1))


def run_chapters(jobs: list[Job], workers: int | None = None, *, scheduler: str | None = None,
                 progress: bool = True, plans: bool = True) -> list[JobResult]:
    """Run chapters :func:`local_workers` at a time, longest first, each worker's kernels
    with CPUs // workers threads, or, with ``scheduler``, longest first on the Dask cluster
    at that address; the results come back in the order of ``jobs``. With ``plans``, the
    stored models the chapters that must run will ask for (:mod:`attention_dynamics.book.plans`)
    are made first, as tasks of their own, and each such chapter starts when its models
    exist (one worker: each chapter's models right before it)."""
    planned, follow = planned_models(jobs) if plans else ({}, {})
    n_models = len({t.identity for ts in planned.values() for t in ts})
    if scheduler:
        executor = dask_executor(scheduler)
        line = f"{len(jobs)} chapters on the Dask cluster at {scheduler}, longest first"
    else:
        # one per chapter and per model made first; a follow-up's models are not known yet
        workers = local_workers(workers, len(jobs) + n_models + (usable_cpus() if follow else 0))
        if workers <= 1:
            return Results(run_jobs(jobs, progress=progress, plans=planned, follow_ups=follow), workers=1)
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, usable_cpus() // workers)
        executor = ProcessPoolExecutor(max_workers=workers, initializer=_use_threads, initargs=(threads,))
        line = f"{len(jobs)} chapters, {workers} side by side, {threads} thread(s) each"
    with executor as pool:
        if (planned or follow) and getattr(pool, "threads_per_worker", 1) > 1:
            # two models made at once in one process would share PyTorch's global generator
            print(f"warning: a Dask worker runs {pool.threads_per_worker} threads; the stored models are left to "
                  f"their chapters (start the workers with --nthreads 1 to make them as tasks)", flush=True)
            planned, follow, n_models = {}, {}, 0
        if progress:
            print(line + (f"; first {n_models} stored model(s) of {len(planned)} chapter(s), as tasks"
                          if n_models else ""), flush=True)
        results = {r.name: r for r in run_jobs(longest_first(jobs), pool, progress=progress, plans=planned,
                                               follow_ups=follow)}
    return Results([results[j.stem] for j in jobs], workers=None if scheduler else workers)


class Results(list):
    """The chapters' results in book order, with the local pool's size (None on Dask)."""

    def __init__(self, results, *, workers: int | None):
        super().__init__(results)
        self.workers = workers


def planned_models(jobs: list[Job]) -> tuple[dict[str, list], dict[str, object]]:
    """The plans (:func:`attention_dynamics.book.plans.plan`) and follow-ups
    (:func:`~attention_dynamics.book.plans.follow_up`) of the chapters that will run (a
    chapter whose outputs are cached needs no model). A plan that cannot be made (a bug in
    it) is reported and left out: its chapter trains its own models."""
    from .cache import cache_key, cached_result
    from .plans import follow_up, plan

    tasks, follow = {}, {}
    for job in jobs:
        if cached_result(job, cache_key(job))[0] is not None:
            continue
        try:
            mine, then = plan(job), follow_up(job)
        except Exception as e:
            print(f"warning: {job.stem}: its plan failed ({type(e).__name__}: {e}); the chapter makes its own "
                  f"models", flush=True)
            continue
        if mine:
            tasks[job.stem] = mine
        if then is not None:
            follow[job.stem] = then
    return tasks, follow


def run_jobs(jobs: list[Job], executor: Executor | None = None, *, progress: bool = True,
             plans: dict[str, list] | None = None, follow_ups: dict | None = None) -> list[JobResult]:
    """Run jobs one after another, or on any concurrent.futures executor (a process
    pool, or a Dask cluster's ``client.get_executor()``). Prints one line per finished
    chapter (and, on a terminal, a per-cell bar while one runs). Stops at the first
    failure: jobs not yet started are cancelled, running ones finish, then the failure
    (with its chapter, cell and cause) is raised. The results come back in the order of
    ``jobs``.

    ``plans``: chapter name -> the models to make first
    (:class:`attention_dynamics.book.plans.ModelTask`), each made once however many
    chapters plan it; ``follow_ups``: chapter name -> a call that returns more tasks once
    that chapter's first models exist (:mod:`attention_dynamics.book.dispatch`). A model
    that fails is reported and left to its chapter, which makes it itself and, if it fails
    again, says where."""
    if executor is None:
        return one_after_another(jobs, progress, plans or {}, dict(follow_ups or {}))
    return Dispatch(executor, jobs, plans or {}, dict(follow_ups or {}), progress).run()


SCHEDULER_TIMEOUT_S = 10
# A Dask nanny starts its worker with MALLOC_TRIM_THRESHOLD_=65536
# (distributed.nanny.pre-spawn-environ), and the chapters' kernels inherit it. Setting it at
# all fixes glibc's mmap threshold at 128 KiB, so each larger tensor is mapped, faulted in and
# unmapped again on every step. benchmarks/dask_workers.py (AMD EPYC Zen 4, 2026-12-04, medians
# of 3) measured a wind-tunnel step on a worker at 53.5 ms with it and 29.6 ms without (1.81x;
# 12,100 minor page faults per step against 33-257). The quick book on two workers took 246 s
# with it (one run) and 162-171 s without in five runs of six (one took 203 s), against 161 and
# 167 s on the local pool. Dask's profiler made no difference (on: 171, 162 s; off: 166, 170 s).
MALLOC_TRIM = "MALLOC_TRIM_THRESHOLD_"
KEEP_GLIBC_DEFAULT = ("DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON", "{'MALLOC_TRIM_THRESHOLD_': None}")


def _malloc_trim() -> str | None:
    """The variable as the worker process started with it (glibc reads it then; a later
    change to os.environ does not reach the allocator), else as os.environ has it."""
    try:
        start = Path("/proc/self/environ").read_bytes().split(b"\0")
    except OSError:
        return os.environ.get(MALLOC_TRIM)
    prefix = MALLOC_TRIM.encode() + b"="
    return next((e[len(prefix):].decode(errors="replace") for e in start if e.startswith(prefix)), None)


def malloc_trim_warning(client) -> str | None:
    """A warning naming the workers of ``client``'s cluster that started with
    MALLOC_TRIM_THRESHOLD_ set, and how to start them without it; a note when no worker has
    connected yet (a batch queue's workers join later: they are not checked); None when
    none has it, or when the workers cannot be asked (a check must not stop the book)."""
    try:
        got = client.run(_malloc_trim, on_error="return")
    except Exception:
        return None
    if not got:
        return f"note: no Dask worker had connected yet; whether they start with {MALLOC_TRIM} set is not checked"
    set_ = {w: v for w, v in got.items() if isinstance(v, str)}
    if not set_:
        return None
    name, value = KEEP_GLIBC_DEFAULT
    shown = ", ".join(sorted(set_)[:4]) + (f" and {len(set_) - 4} more" if len(set_) > 4 else "")
    return (f"warning: {len(set_)} of {len(got)} Dask worker(s) started with {MALLOC_TRIM}="
            f"{', '.join(sorted(set(set_.values())))} ({shown}), which fixes glibc's mmap threshold and slows "
            f"training; a Dask nanny sets it unless the workers start with {name}=\"{value}\" in their "
            f"environment, and it must not be set there itself (book/cluster.md)")


@contextmanager
def dask_executor(scheduler: str):
    """A concurrent.futures executor on the Dask cluster at ``scheduler``; a clear error
    when it cannot be reached within SCHEDULER_TIMEOUT_S."""
    from distributed import Client

    try:
        client = Client(scheduler, timeout=f"{SCHEDULER_TIMEOUT_S}s")
    except Exception as e:  # OSError, TimeoutError, or a malformed address
        raise ValueError(f"cannot reach the Dask scheduler at {scheduler} within {SCHEDULER_TIMEOUT_S} s "
                         f"({type(e).__name__})") from None
    with client:
        warning = malloc_trim_warning(client)
        if warning:
            print(warning, flush=True)
        executor = client.get_executor()
        # plans need one thread per worker (models made in one process share its generator)
        executor.threads_per_worker = max(client.nthreads().values(), default=1)
        yield executor


def run_grid(jobs: list[Job], workers: int | None, scheduler: str | None) -> "Results":
    if scheduler:
        with dask_executor(scheduler) as executor:
            return Results(run_jobs(jobs, executor), workers=None)
    if workers and workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers, initializer=_fresh_event_loop) as pool:
            return Results(run_jobs(jobs, pool), workers=workers)
    return Results(run_jobs(jobs), workers=1)
