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
from concurrent.futures import FIRST_COMPLETED, Executor, wait
from pathlib import Path

from ..store import missing_seconds
from .execution import execute
from .jobs import RESULTS, Job, JobResult

__all__ = ["usable_cpus", "expected_seconds", "longest_first", "run_chapters", "run_jobs", "run_grid",
           "dask_executor", "local_workers", "SCHEDULER_TIMEOUT_S"]


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _use_threads(threads: int) -> None:
    """In a worker: the kernels it starts (and their PyTorch) use this many threads."""
    for var in THREAD_VARIABLES:
        os.environ[var] = str(threads)


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
            models = prov.get("models") if isinstance(prov.get("models"), list) else []
            made_then = sum(m["seconds"] for m in models if isinstance(m, dict) and m.get("loaded") is False
                            and isinstance(m.get("seconds"), (int, float)))
            return max(prov["seconds"] - made_then, 0.0) + missing_seconds(models)
    return 0.0


def longest_first(jobs: list[Job]) -> list[Job]:
    """The jobs by the time their last run took, longest first (stable for ties)."""
    return sorted(jobs, key=expected_seconds, reverse=True)


def local_workers(workers: int | None, n_jobs: int) -> int:
    """How many chapters a local run puts side by side: ``workers`` (default one per usable
    CPU), at most one per chapter."""
    return min(workers or usable_cpus(), max(n_jobs, 1))


def run_chapters(jobs: list[Job], workers: int | None = None, *, scheduler: str | None = None,
                 progress: bool = True) -> list[JobResult]:
    """Run chapters :func:`local_workers` at a time, longest first, each worker's kernels
    with CPUs // workers threads, or, with ``scheduler``, longest first on the Dask cluster
    at that address; the results come back in the order of ``jobs``."""
    if scheduler:
        executor = dask_executor(scheduler)
        line = f"{len(jobs)} chapters on the Dask cluster at {scheduler}, longest first"
    else:
        workers = local_workers(workers, len(jobs))
        if workers <= 1:
            return run_jobs(jobs, progress=progress)
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, usable_cpus() // workers)
        executor = ProcessPoolExecutor(max_workers=workers, initializer=_use_threads, initargs=(threads,))
        line = f"{len(jobs)} chapters, {workers} side by side, {threads} thread(s) each"
    if progress:
        print(line, flush=True)
    with executor as pool:
        results = {r.name: r for r in run_jobs(longest_first(jobs), pool, progress=progress)}
    return [results[j.stem] for j in jobs]


def _report(i: int, total: int, r: JobResult) -> None:
    print(f"[{i}/{total}] {r.name}: {r.status}" + (f" in {r.seconds:.1f} s" if r.status == "ran" else ""), flush=True)


def run_jobs(jobs: list[Job], executor: Executor | None = None, *, progress: bool = True) -> list[JobResult]:
    """Run jobs one after another, or on any concurrent.futures executor (a process
    pool, or a Dask cluster's ``client.get_executor()``). Prints one line per finished
    chapter (and, on a terminal, a per-cell bar while one runs). Stops at the first
    failure: jobs not yet started are cancelled, running ones finish, then the failure
    (with its chapter, cell and cause) is raised."""
    results: list[JobResult] = []
    total = len(jobs)
    if executor is None:
        for i, job in enumerate(jobs, 1):
            r = execute(job, progress_bar=progress and sys.stderr.isatty())
            results.append(r)
            if progress:
                _report(i, total, r)
        return results
    futures = [executor.submit(execute, job) for job in jobs]
    done_count = 0
    pending = set(futures)
    while pending:
        # each chapter reported as it finishes (FIRST_EXCEPTION would wait for all of them
        # unless one failed); a failure is seen as soon as its chapter ends either way
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for f in pending:
                f.cancel()
            wait(pending)  # running jobs finish and clean up after themselves
            raise failed[0].exception()
        for f in done:
            done_count += 1
            if progress:
                _report(done_count, total, f.result())
    return [f.result() for f in futures]


SCHEDULER_TIMEOUT_S = 10


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
        yield client.get_executor()


def run_grid(jobs: list[Job], workers: int | None, scheduler: str | None) -> list[JobResult]:
    if scheduler:
        with dask_executor(scheduler) as executor:
            return run_jobs(jobs, executor)
    if workers and workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            return run_jobs(jobs, pool)
    return run_jobs(jobs)
