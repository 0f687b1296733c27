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
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from pathlib import Path

from ..store import missing_seconds
from .execution import execute
from .jobs import RESULTS, Job, JobResult
from .plans import run_model_task, unused_planned

__all__ = ["usable_cpus", "expected_seconds", "longest_first", "run_chapters", "run_jobs", "run_grid",
           "dask_executor", "local_workers", "SCHEDULER_TIMEOUT_S"]


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _use_threads(threads: int) -> None:
    """In a worker: the kernels it starts (and their PyTorch) use this many threads, and so
    does the worker itself where it makes a planned model (a forked worker inherits the
    runner's PyTorch with its thread count already set)."""
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


def _report(i: int, total: int, r: JobResult) -> None:
    print(f"[{i}/{total}] {r.name}: {r.status}" + (f" in {r.seconds:.1f} s" if r.status == "ran" else ""), flush=True)


def _model_failure(f) -> BaseException | None:
    """Why a model task's future did not give a model (None when it did)."""
    if f.cancelled():
        from concurrent.futures import CancelledError

        return CancelledError("cancelled")
    return f.exception()


def _result_or_raise(f):
    e = _model_failure(f)
    if e is not None:
        raise e
    return f.result()


def _report_model(i: int, total: int, label: str, f) -> None:
    e = _model_failure(f)
    if e is not None:
        print(f"[model {i}/{total}] {label}: failed ({type(e).__name__}: {e}); its chapter will make it", flush=True)
    else:
        print(f"[model {i}/{total}] {label}: made in {f.result()[1]:.1f} s", flush=True)


def _attach_plans(results: list[JobResult], made: dict[str, tuple], failed: set[str], needs: dict) -> None:
    """Each result's planned models (their files, and the seconds each task took) and failed
    plan tasks; a warning where its plan made models the chapter did not load (the plan's
    settings drifted from its own). ``made``: identity -> (label, seconds, file)."""
    for r in results:
        mine = sorted((made[i][2], made[i][1]) for i in needs.get(r.name, ()) if i in made and made[i][2])
        r.planned = tuple(f for f, _ in mine)
        r.planned_seconds = tuple(t for _, t in mine)
        r.planned_failed = tuple(sorted(i for i in needs.get(r.name, ()) if i in failed))
        unused = unused_planned(r)
        if unused:
            print(f"warning: {r.name}: its plan made model(s) it did not load ({', '.join(unused)}): the plan's "
                  f"settings differ from the chapter's (attention_dynamics/book/plans.py)", flush=True)


def _follow_up_tasks(stem: str, get, progress: bool) -> list:
    """The tasks a chapter's follow-up gave (``get()`` returns them or raises): checked to be
    model tasks; none, with a warning, where it failed or gave something else."""
    from .plans import ModelTask

    try:
        more = list(get())
        if not all(isinstance(t, ModelTask) for t in more):
            raise TypeError("it gave something other than model tasks")
    except Exception as e:
        print(f"warning: {stem}: its plan's follow-up failed ({type(e).__name__}: {e}); the chapter makes the "
              f"rest of its models", flush=True)
        return []
    if progress:
        print(f"[plan] {stem}: {len(more)} more model(s), from the first ones", flush=True)
    return more


def _one_after_another(jobs: list[Job], progress: bool, plans: dict, follow_ups: dict,
                       order: list[Job]) -> list[JobResult]:
    """One worker: each chapter after the models its plan names (each made once)."""
    results, made, failed, needs, count = {}, {}, set(), {}, 0
    known = {t.identity for ts in plans.values() for t in ts}
    for i, job in enumerate(jobs, 1):
        stages = [plans.get(job.stem, [])]
        if job.stem in follow_ups:
            stages.append(None)  # computed once the first stage is made
        for stage in stages:
            if stage is None and needs.get(job.stem, set()) & failed:
                print(f"warning: {job.stem}: some of its first models failed; its plan's follow-up is left to "
                      f"the chapter", flush=True)
                break
            tasks = stage if stage is not None else _follow_up_tasks(job.stem, follow_ups[job.stem], progress)
            known |= {t.identity for t in tasks}
            for t in tasks:
                needs.setdefault(job.stem, set()).add(t.identity)
                if t.identity in made or t.identity in failed:
                    continue
                f = Future()
                try:
                    f.set_result(run_model_task(t))
                    made[t.identity] = f.result()
                except Exception as e:
                    f.set_exception(e)
                    failed.add(t.identity)
                count += 1
                if progress:
                    _report_model(count, len(known), t.label, f)
        r = execute(job, progress_bar=progress and sys.stderr.isatty())
        results[job.stem] = r
        if progress:
            _report(i, len(jobs), r)
    out = [results[j.stem] for j in order]
    _attach_plans(out, made, failed, needs)
    return out


def run_jobs(jobs: list[Job], executor: Executor | None = None, *, progress: bool = True,
             plans: dict[str, list] | None = None, follow_ups: dict | None = None,
             order: list[Job] | None = None) -> list[JobResult]:
    """Run jobs one after another, or on any concurrent.futures executor (a process
    pool, or a Dask cluster's ``client.get_executor()``). Prints one line per finished
    chapter (and, on a terminal, a per-cell bar while one runs). Stops at the first
    failure: jobs not yet started are cancelled, running ones finish, then the failure
    (with its chapter, cell and cause) is raised. The results come back in the order of
    ``order`` (default: of ``jobs``).

    ``plans``: chapter name -> the models to make first
    (:class:`attention_dynamics.book.plans.ModelTask`); each model is made once, however
    many chapters plan it. ``follow_ups``: chapter name -> a call that returns more tasks
    once that chapter's first models exist (models whose settings depend on results). On
    an executor the tasks go out in the order of ``jobs`` (longest first: each chapter's
    models, or the chapter itself when it needs none), and a chapter when its models are
    made. A model that fails is reported and left to its chapter, which makes it itself and,
    if it fails again, says where."""
    order = order or jobs
    plans, follow = plans or {}, dict(follow_ups or {})
    if executor is None:
        return _one_after_another(jobs, progress, plans, follow, order)
    models, needs, labels, chapters, expanding = {}, {}, {}, {}, {}
    pending = set()

    def submit_models(stem, tasks):
        for t in tasks:
            if t.identity not in models:
                models[t.identity] = (t, executor.submit(run_model_task, t))
                labels[models[t.identity][1]] = t.label
                pending.add(models[t.identity][1])
            needs.setdefault(stem, set()).add(t.identity)

    waiting = []
    for job in jobs:  # longest first, as given: a chapter's models, or the chapter itself
        submit_models(job.stem, plans.get(job.stem, []))
        if needs.get(job.stem) or job.stem in follow:
            waiting.append(job)
        else:
            chapters[job.stem] = executor.submit(execute, job)
            pending.add(chapters[job.stem])

    def release():
        """Submit what has become possible: a follow-up once its chapter's first models
        exist, a chapter once all its models do."""
        ready = {i for i, (_, f) in models.items() if f.done()}
        for job in list(waiting):
            if not needs.get(job.stem, set()) <= ready or job.stem in expanding.values():
                continue
            if job.stem in follow:
                then = follow.pop(job.stem)
                if any(_model_failure(models[i][1]) is not None for i in needs.get(job.stem, ())):
                    print(f"warning: {job.stem}: some of its first models failed; its plan's follow-up is left "
                          f"to the chapter", flush=True)
                else:
                    f = executor.submit(then)
                    expanding[f] = job.stem
                    pending.add(f)
                    continue
            waiting.remove(job)
            chapters[job.stem] = executor.submit(execute, job)
            pending.add(chapters[job.stem])

    release()
    done_count = made = 0
    while pending:
        # each chapter reported as it finishes (FIRST_EXCEPTION would wait for all of them
        # unless one failed); a failure is seen as soon as its chapter ends either way
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        pending -= done
        failed = [f for f in done if f not in labels and f not in expanding
                  and (f.cancelled() or f.exception() is not None)]
        if failed:
            if progress and pending:
                print(f"a chapter failed; waiting for {len(pending)} running task(s) to stop", flush=True)
            for f in pending:
                f.cancel()
            wait(pending)  # running jobs finish and clean up after themselves
            raise failed[0].exception() if not failed[0].cancelled() else RuntimeError("a chapter was cancelled")
        for f in done:
            if f in labels:
                made += 1
                if progress:
                    _report_model(made, len(labels), labels[f], f)
            elif f in expanding:
                stem = expanding.pop(f)
                submit_models(stem, _follow_up_tasks(stem, lambda: _result_or_raise(f), progress))
            else:
                done_count += 1
                if progress:
                    _report(done_count, len(jobs), f.result())
        release()
    made_ok = {i: f.result() for i, (_, f) in models.items() if _model_failure(f) is None}
    broken = {i for i, (_, f) in models.items() if _model_failure(f) is not None}
    results = [chapters[j.stem].result() for j in order]
    _attach_plans(results, made_ok, broken, needs)
    return results


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
        executor = client.get_executor()
        # plans need one thread per worker (models made in one process share its generator)
        executor.threads_per_worker = max(client.nthreads().values(), default=1)
        yield executor


def run_grid(jobs: list[Job], workers: int | None, scheduler: str | None) -> list[JobResult]:
    if scheduler:
        with dask_executor(scheduler) as executor:
            return run_jobs(jobs, executor)
    if workers and workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            return run_jobs(jobs, pool)
    return run_jobs(jobs)
