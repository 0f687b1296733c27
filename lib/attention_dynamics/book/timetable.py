"""The time table a build prints at its end: each chapter's seconds, threads and share, the
sum, the stored models made first as tasks (book.plans), the wall clock with the processor,
and the two bounds no schedule can beat: the critical path (the longest chapter after the
longest model made for it) and the seconds run now spread evenly over the workers."""
from __future__ import annotations

from .jobs import JobResult
from .scheduling import usable_cpus

__all__ = ["timing_table"]


def timing_table(results: list[JobResult], wall_seconds: float | None = None, workers: int | None = None) -> str:
    """Each chapter's seconds (this run's, or its cached run's), threads and share of the
    sum; then the sum, the wall-clock time of this run with the processor, and (with a wall
    time) the lower bounds on it: the longest chapter run now and, given ``workers``, the
    seconds run now over the workers."""
    from ..machine import cpu_model

    width = max([len(r.name) for r in results] + [16])
    secs = [float(r.record.get("provenance", {}).get("seconds", r.seconds)) for r in results]
    whole = sum(secs) or 1.0
    lines = [f"{'chapter':<{width}}  status   seconds  threads  share",
             f"{'-' * width}  ------  --------  -------  -----"]
    for r, t in zip(results, secs):
        threads = r.record.get("provenance", {}).get("threads", "")
        lines.append(f"{r.name:<{width}}  {r.status:<6}  {t:8.1f}  {threads!s:>7}  {100 * t / whole:4.0f}%")
    lines.append(f"{'sum of chapters':<{width}}          {sum(secs):8.1f}")
    models = {f: t for r in results for f, t in zip(r.planned, r.planned_seconds)}
    if models:
        lines.append(f"{f'{len(models)} models first':<{width}}          {sum(models.values()):8.1f}  "
                     f"(made as tasks; the chapters loaded them)")
    ran = sum(r.seconds for r in results) + sum(models.values())
    lines.append(f"{'executed now':<{width}}          {ran:8.1f}")
    if wall_seconds is not None:
        lines.append(f"{'wall clock':<{width}}          {wall_seconds:8.1f}  on {cpu_model()}, "
                     f"{usable_cpus()} CPUs")
        # a chapter after the longest of its models: the critical path when models are tasks
        path = max((max(r.planned_seconds, default=0.0) + r.seconds for r in results if r.status == "ran"),
                   default=0.0)
        why = ("the critical path: a chapter after its longest model" if models
               else "the critical path of whole chapters")
        lines.append(f"{'bound: longest':<{width}}          {path:8.1f}  ({why})")
        if workers:
            lines.append(f"{'bound: even':<{width}}          {ran / workers:8.1f}  (executed now over {workers} workers)")
    return "\n".join(lines)
