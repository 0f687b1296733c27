"""How long a build of the book takes on W workers, from the records of a build: each
chapter's own seconds and the stored models it used (provenance ``models``, with the seconds
their training took), scheduled two ways, with the lower bounds no schedule can beat.

- **whole chapters** (the runner with ``--no-plans``): longest first; a chapter trains the
  models it is the first to ask for, and one that asks for a model another worker is training
  waits for it (the store's lock);
- **models as tasks** (the runner's default, :mod:`attention_dynamics.book.plans`): every
  stored model is a task of its own and a chapter starts when its models exist; simulated
  with the longest path to the end first (the runner approximates that order: each
  chapter's models in the order of the chapters' expected seconds). The records list every
  model a chapter used, planned or not, and the simulation makes them all tasks: it shows
  what plans give at best (the fair comparison's test runs, for one, stay in their chapter).

Both on a fresh store (every model made) and, with ``--warm``, on a store that holds them.
The critical path is the longest chain of tasks that must follow one another; no number of
workers finishes sooner than it, nor sooner than the summed seconds over the workers.

    .venv/bin/python benchmarks/book_schedule.py results/paper --workers 2 4 8 16
    .venv/bin/python benchmarks/book_schedule.py OUT --wall 9871   # set a real build's wall clock beside it

A benchmark, not a test: the seconds are the records' (their machine is printed), and the
schedule is simulated, not run.
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from attention_dynamics.store import own_seconds, recorded_models


@dataclass
class Chapter:
    name: str
    own: float  # its seconds without the training of the models it made in that run
    models: dict[str, float] = field(default_factory=dict)  # file -> training seconds


def read_chapters(folder: Path) -> tuple[list[Chapter], set[str]]:
    """The chapters of a folder of records, and the processors they ran on."""
    chapters, cpus = [], set()
    for path in sorted(folder.glob("*.json")):
        prov = json.loads(path.read_text(encoding="utf-8")).get("provenance", {})
        if "seconds" not in prov:
            continue
        if "models" not in prov:
            sys.exit(f"{path.name} has no list of stored models (a record from before they were recorded)")
        chapters.append(Chapter(prov.get("chapter", path.stem), own_seconds(prov),
                                {m["file"]: float(m["seconds"]) for m in recorded_models(prov["models"])}))
        cpus.add(f"{prov.get('cpu', '?')}, {prov.get('threads', '?')} thread(s)")
    return chapters, cpus


def whole_chapters(chapters: list[Chapter], workers: int, fresh: bool) -> tuple[float, list[tuple]]:
    """Simulated wall clock of whole chapters, longest first (by own seconds plus the
    training of all its models, as the runner estimates on a fresh store), and the schedule
    (chapter, worker, start, end). A chapter trains, one after another, the models nobody
    has started; then waits for those another worker is training; then runs."""
    order = sorted(chapters, key=lambda c: c.own + (sum(c.models.values()) if fresh else 0.0), reverse=True)
    free = [(0.0, w) for w in range(workers)]
    ready_at: dict[str, float] = {} if fresh else {f: 0.0 for c in chapters for f in c.models}
    schedule = []
    for c in order:
        start, w = heapq.heappop(free)
        t = start
        for f, s in sorted(c.models.items()):
            if f not in ready_at:
                t += s
                ready_at[f] = t
        t = max([t] + [ready_at[f] for f in c.models]) + c.own
        schedule.append((c.name, w, start, t))
        heapq.heappush(free, (t, w))
    return max(end for *_, end in schedule), schedule


def models_as_tasks(chapters: list[Chapter], workers: int, fresh: bool) -> tuple[float, list[tuple]]:
    """Simulated wall clock when every model is a task: list scheduling by the longest path
    to the end (a model's seconds plus the longest chapter that needs it; a chapter's own),
    each task on the first free worker once what it needs exists."""
    models = {f: s for c in chapters for f, s in c.models.items()} if fresh else {}
    tasks = {f: (s, (), s + max(c.own for c in chapters if f in c.models)) for f, s in models.items()}
    tasks |= {c.name: (c.own, tuple(f for f in c.models if f in models), c.own) for c in chapters}
    free = [(0.0, w) for w in range(workers)]
    done_at: dict[str, float] = {}
    schedule = []
    while len(done_at) < len(tasks):
        at, w = heapq.heappop(free)
        ready = [n for n, (_, deps, _) in tasks.items()
                 if n not in done_at and all(done_at.get(d, float("inf")) <= at for d in deps)]
        if not ready:  # wait for the next task that finishes
            heapq.heappush(free, (min(t for t in done_at.values() if t > at), w))
            continue
        n = max(ready, key=lambda n: tasks[n][2])
        done_at[n] = at + tasks[n][0]
        schedule.append((n, w, at, done_at[n]))
        heapq.heappush(free, (done_at[n], w))
    return max(end for *_, end in schedule), schedule


def lower_bound(chapters: list[Chapter], workers: int, fresh: bool) -> tuple[float, str]:
    """No schedule beats the critical path (a chapter after the longest model it needs) nor
    the summed seconds over the workers; the larger of the two, and the chain behind the
    critical path."""
    models = {f: s for c in chapters for f, s in c.models.items()} if fresh else {}
    total = sum(c.own for c in chapters) + sum(models.values())
    length, c = max(((max([models.get(f, 0.0) for f in c.models] + [0.0]) + c.own, c) for c in chapters),
                    key=lambda x: x[0])
    heavy = max(c.models, key=lambda f: models.get(f, 0.0), default=None) if models else None
    chain = (f"{heavy} ({models[heavy]:.0f} s), then " if heavy else "") + f"{c.name} ({c.own:.0f} s)"
    return max(length, total / workers), f"critical path {length:.0f} s: {chain}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", type=Path, help="a folder of chapter records (results/paper, or a build's --out)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--warm", action="store_true", help="a store that holds every model (default: a fresh one)")
    ap.add_argument("--wall", type=float, help="a real build's wall clock, printed beside the simulation")
    ap.add_argument("--show", type=int, default=0, metavar="W", help="print the schedule on W workers")
    args = ap.parse_args()
    if any(w < 1 for w in args.workers) or args.show < 0:
        sys.exit("--workers and --show take whole numbers >= 1")
    chapters, cpus = read_chapters(args.records)
    if not chapters:
        sys.exit(f"no records in {args.records}")
    fresh = not args.warm
    models = {f: s for c in chapters for f, s in c.models.items()}
    print(f"{len(chapters)} chapters, {len(models)} stored models ({sum(models.values()):.0f} s of training), "
          f"{sum(c.own for c in chapters):.0f} s of chapters; {'fresh' if fresh else 'warm'} store; "
          f"seconds measured on {'; '.join(sorted(cpus))}")
    print(f"{'workers':>7}  {'whole chapters':>14}  {'models as tasks':>15}  {'lower bound':>11}")
    for w in args.workers:
        whole, _ = whole_chapters(chapters, w, fresh)
        split, _ = models_as_tasks(chapters, w, fresh)
        bound, chain = lower_bound(chapters, w, fresh)
        print(f"{w:7d}  {whole:14.0f}  {split:15.0f}  {bound:11.0f}")
    print(chain)
    if args.wall:
        print(f"a real build: {args.wall:.0f} s wall clock")
    if args.show:
        for title, fn in (("whole chapters", whole_chapters), ("models as tasks", models_as_tasks)):
            _, schedule = fn(chapters, args.show, fresh)
            print(f"\n{title} on {args.show} workers (task, worker, start, end in s):")
            for name, w, start, end in sorted(schedule, key=lambda r: (r[1], r[2])):
                print(f"  {name:<40} {w:3d} {start:9.0f} {end:9.0f}")


if __name__ == "__main__":
    main()
