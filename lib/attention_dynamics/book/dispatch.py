"""A build's tasks in the order they can run: the stored models the chapters' plans name
(:mod:`attention_dynamics.book.plans`), each made once however many chapters need it; the
models a follow-up names once a chapter's first models exist; each chapter once all its
models do. On an executor (a process pool, a Dask cluster) the tasks go out as they become
possible; on one worker each chapter follows its own models. A model or follow-up that
fails is reported and left to its chapter, which makes the model itself (and says where, if
that fails too); a chapter that fails stops the build."""
from __future__ import annotations

import sys
from concurrent.futures import FIRST_COMPLETED, CancelledError, Executor, Future, wait

from .execution import execute
from .jobs import Job, JobResult
from .plans import ModelTask, run_model_task, unused_planned

__all__ = ["Dispatch", "one_after_another"]


def report(i: int, total: int, r: JobResult) -> None:
    print(f"[{i}/{total}] {r.name}: {r.status}" + (f" in {r.seconds:.1f} s" if r.status == "ran" else ""), flush=True)


def _failure(f: Future) -> BaseException | None:
    """Why a model's or follow-up's future gave nothing (None when it gave its result)."""
    return CancelledError("cancelled") if f.cancelled() else f.exception()


def _report_model(i: int, total: int, label: str, f: Future) -> None:
    e = _failure(f)
    if e is not None:
        print(f"[model {i}/{total}] {label}: failed ({type(e).__name__}: {e}); its chapter will make it", flush=True)
    else:
        print(f"[model {i}/{total}] {label}: made in {f.result()[1]:.1f} s", flush=True)


def _follow_up_tasks(stem: str, get, progress: bool) -> list[ModelTask]:
    """The tasks a chapter's follow-up gave (``get()`` returns them or raises): checked to be
    model tasks; none, with a warning, where it failed or gave something else."""
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


def _skip_follow_up(stem: str) -> None:
    print(f"warning: {stem}: some of its first models failed; its plan's follow-up is left to the chapter",
          flush=True)


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


def one_after_another(jobs: list[Job], progress: bool, plans: dict, follow_ups: dict) -> list[JobResult]:
    """One worker: each chapter after the models its plan and follow-up name (each made
    once); the results in the order of ``jobs``."""
    results, made, failed, needs, count = {}, {}, set(), {}, 0
    known = {t.identity for ts in plans.values() for t in ts}
    for i, job in enumerate(jobs, 1):
        stages = [plans.get(job.stem, [])] + ([None] if job.stem in follow_ups else [])
        for stage in stages:  # None: the follow-up's, once the first stage is made
            if stage is None and needs.get(job.stem, set()) & failed:
                _skip_follow_up(job.stem)
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
        results[job.stem] = execute(job, progress_bar=progress and sys.stderr.isatty())
        if progress:
            report(i, len(jobs), results[job.stem])
    out = [results[j.stem] for j in jobs]
    _attach_plans(out, made, failed, needs)
    return out


class Dispatch:
    """The tasks of ``jobs`` (longest first) on ``executor``: each chapter's models as soon as
    it is its turn, or the chapter itself when it needs none; the rest as they become
    possible (:meth:`run`)."""

    def __init__(self, executor: Executor, jobs: list[Job], plans: dict, follow_ups: dict, progress: bool):
        self.executor, self.jobs, self.follow, self.progress = executor, jobs, follow_ups, progress
        self.models: dict[str, tuple[ModelTask, Future]] = {}  # identity -> (task, future)
        self.needs: dict[str, set[str]] = {}  # chapter -> identities
        self.labels: dict[Future, str] = {}  # a model's future -> its label
        self.expanding: dict[Future, str] = {}  # a follow-up's future -> its chapter
        self.chapters: dict[str, Future] = {}
        self.pending: set[Future] = set()
        self.waiting: list[Job] = []
        self.made = self.finished = 0
        for job in jobs:
            self._submit_models(job.stem, plans.get(job.stem, []))
            if self.needs.get(job.stem) or job.stem in follow_ups:
                self.waiting.append(job)
            else:
                self._submit_chapter(job)

    def _submit_models(self, stem: str, tasks: list[ModelTask]) -> None:
        for t in tasks:
            if t.identity not in self.models:
                f = self.executor.submit(run_model_task, t)
                self.models[t.identity], self.labels[f] = (t, f), t.label
                self.pending.add(f)
            self.needs.setdefault(stem, set()).add(t.identity)

    def _submit_chapter(self, job: Job) -> None:
        self.chapters[job.stem] = self.executor.submit(execute, job)
        self.pending.add(self.chapters[job.stem])

    def _release(self) -> None:
        """Submit what has become possible: a follow-up once its chapter's first models
        exist (skipped if one failed), a chapter once all its models do."""
        ready = {i for i, (_, f) in self.models.items() if f.done()}
        for job in list(self.waiting):
            if not self.needs.get(job.stem, set()) <= ready or job.stem in self.expanding.values():
                continue
            if job.stem in self.follow:
                then = self.follow.pop(job.stem)
                if not any(_failure(self.models[i][1]) for i in self.needs.get(job.stem, ())):
                    f = self.executor.submit(then)
                    self.expanding[f] = job.stem
                    self.pending.add(f)
                    continue
                _skip_follow_up(job.stem)
            self.waiting.remove(job)
            self._submit_chapter(job)

    def _stop(self, failed: Future) -> None:
        """A chapter failed: cancel what has not started, let the rest finish, raise."""
        if self.progress and self.pending:
            print(f"a chapter failed; waiting for {len(self.pending)} running task(s) to stop", flush=True)
        for f in self.pending:
            f.cancel()
        wait(self.pending)  # running jobs finish and clean up after themselves
        raise failed.exception() if not failed.cancelled() else RuntimeError("a chapter was cancelled")

    def _take(self, f: Future) -> None:
        """One finished task: report it, and a follow-up's models go out."""
        if f in self.labels:
            self.made += 1
            if self.progress:
                _report_model(self.made, len(self.labels), self.labels[f], f)
        elif f in self.expanding:
            stem = self.expanding.pop(f)
            self._submit_models(stem, _follow_up_tasks(stem, lambda: _result_or_raise(f), self.progress))
        else:
            self.finished += 1
            if self.progress:
                report(self.finished, len(self.jobs), f.result())

    def run(self) -> list[JobResult]:
        """Until every chapter has run; the results in the order of the jobs."""
        self._release()
        while self.pending:
            # each task taken as it finishes (FIRST_EXCEPTION would wait for all of them
            # unless one failed); a chapter's failure is seen as soon as it ends
            done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
            self.pending -= done
            for f in done:
                if f not in self.labels and f not in self.expanding and (f.cancelled() or f.exception()):
                    self._stop(f)
            for f in done:
                self._take(f)
            self._release()
        made = {i: f.result() for i, (_, f) in self.models.items() if _failure(f) is None}
        failed = {i for i, (_, f) in self.models.items() if _failure(f) is not None}
        results = [self.chapters[j.stem].result() for j in self.jobs]
        _attach_plans(results, made, failed, self.needs)
        return results


def _result_or_raise(f: Future):
    e = _failure(f)
    if e is not None:
        raise e
    return f.result()
