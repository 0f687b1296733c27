"""Where the test suite's time goes: one run of pytest, and what bounds its wall clock.

The suite is two lines of work at once: the session's own tests, one after another in the
pytest process (with the processes they start), and beside them the quick book in a process
of its own (tests/quick_book.py: the chapters, then the no-kernel leg, on the runner's
workers). This runs the suite once and prints

- its wall clock and its work (CPU seconds of pytest and everything it started, from
  ``getrusage``), the bound that work sets on this machine's usable CPUs (work / CPUs: no
  schedule finishes sooner), and the idle CPU-seconds (CPUs x wall - work);
- the busy CPU-seconds of the machine's CPUs over the run (/proc/stat: any process), beside
  the work: processes the suite started and never waited for (a kernel template orphaned
  when its worker ends) are in the one and not the other;
- the book process's work and when its book and its no-kernel leg ended (quick_book.py
  writes them where ``ATTENTION_DYNAMICS_SUITE_TIMES`` names a file), the work of the rest
  (the session's tests), and the tail: the seconds the session ran on after the book ended;
- the busy CPUs, averaged over each stretch of ``--every`` seconds (from /proc/stat, Linux),
  the work by test file (the pytest process's CPU seconds in each test, and the children's
  collected in it: see suite_time_plugin for where a child's work is charged), and the
  longest tests (setup to teardown), with their work.

    .venv/bin/python benchmarks/suite_time.py                 # the whole suite
    .venv/bin/python benchmarks/suite_time.py -- -k routing   # arguments after -- go to pytest

A benchmark, not a test: one run on a machine whose speed may drift (print the CPU beside
it, compare runs side by side). It explains a time; it cannot make one shorter.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]  # also where a test loads this file by its path

from suite_time_plugin import TESTS_ENV  # noqa: E402
from suite_times import TIMES_ENV  # noqa: E402  (the book's process notes its phases where it names a file)


def read_cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) jiffies since boot of the CPUs ``cpus`` (this process's affinity), from
    /proc/stat's per-CPU rows; busy leaves out idle, iowait and steal (time the host gave
    another guest). None off Linux."""
    try:
        rows = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    for row in rows:
        name, *fields = row.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (float(v) for v in fields[:8])
        busy += user + nice + system + irq + softirq
        total += user + nice + system + idle + iowait + irq + softirq + steal
    return busy, total


def busy_cpus(samples: list[tuple[float, float, float]], cpus: int, every: float) -> list[tuple[float, float]]:
    """(start of stretch, mean busy CPUs) for each stretch of ``every`` seconds, from samples
    (seconds since start, busy jiffies, total jiffies) read at increasing times: each
    interval between two samples is shared among the stretches it spans, by time."""
    busy_time: dict[int, float] = {}
    span: dict[int, float] = {}
    for (t0, b0, n0), (t1, b1, n1) in zip(samples, samples[1:]):
        if not (n1 > n0 and t1 > t0):
            continue
        rate = cpus * (b1 - b0) / (n1 - n0)
        k = math.floor(t0 / every)
        while k * every < t1:
            part = min(t1, (k + 1) * every) - max(t0, k * every)
            if part > 0:
                busy_time[k] = busy_time.get(k, 0.0) + part * rate
                span[k] = span.get(k, 0.0) + part
            k += 1
    return [(k * every, busy_time[k] / span[k]) for k in sorted(span)]


def bounds(wall: float, work: float, cpus: int) -> dict[str, float]:
    """The bound the work sets (work over the CPUs) and the idle CPU-seconds of the run
    (negative where the work exceeds what the CPUs could do in the wall clock: a sign that
    the work was not this run's alone, or that the CPUs are not what was counted)."""
    if wall <= 0 or work < 0 or cpus < 1:
        raise ValueError(f"wall must be > 0, work >= 0 and cpus >= 1, got {wall}, {work}, {cpus}")
    return {"bound": work / cpus, "idle": cpus * wall - work}


def read_book_times(path: Path, start: float) -> dict[str, dict[str, float]]:
    """phase -> {"at": seconds after start, "cpu": the book process's CPU seconds then}, from
    quick_book.py's lines (one per phase; a phase noted twice is an error: a second process
    noting its own, the leg, would otherwise replace the book's)."""
    phases: dict[str, dict[str, float]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["phase"] in phases:
                raise ValueError(f"{path}: the phase {row['phase']!r} is noted twice")
            phases[row["phase"]] = {"at": row["time"] - start, "cpu": row["cpu"]}
    return phases


def work_by_file(tests: list[dict]) -> list[tuple[str, int, float, float, float]]:
    """(test file, its tests, seconds in them, the pytest process's CPU seconds in them, the
    CPU seconds of the children collected in them) for each file, the most work (the two
    summed) first, ties by name."""
    rows: dict[str, list] = {}
    for t in tests:
        row = rows.setdefault(t["id"].split("::")[0], [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += t["end"] - t["start"]
        row[2] += t["cpu"]
        row[3] += t["children"]
    return sorted(((f, *r) for f, r in rows.items()), key=lambda r: (-(r[3] + r[4]), r[0]))


def _sampler(samples: list, stop: threading.Event, start: float, cpus: set[int]) -> None:
    while not stop.wait(1.0):
        now = read_cpu_times(cpus)
        if now:
            samples.append((time.monotonic() - start, *now))


def main(argv: list[str]) -> None:
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=30.0, help="seconds per stretch of the busy CPUs (default 30)")
    ap.add_argument("--longest", type=int, default=10,
                    help="how many of the longest tests and of the test files with the most work to print (default 10)")
    args = ap.parse_args(own)
    if not args.every > 0:
        ap.error(f"--every must be > 0 seconds, got {args.every}")
    if args.longest < 0:
        ap.error(f"--longest must be >= 0, got {args.longest}")

    from attention_dynamics.book.scheduling import usable_cpus
    from attention_dynamics.machine import cpu_model

    cpus = usable_cpus()
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(cpus))  # usable_cpus counts these
    with tempfile.TemporaryDirectory() as tmp:
        book_times, tests_log = Path(tmp) / "book.jsonl", Path(tmp) / "tests.jsonl"
        path = os.pathsep.join(p for p in (str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, **{TIMES_ENV: str(book_times), TESTS_ENV: str(tests_log)}, PYTHONPATH=path)
        samples: list = []
        stop = threading.Event()
        start = time.monotonic()
        first = read_cpu_times(mine)
        if first:
            samples.append((0.0, *first))
        watcher = threading.Thread(target=_sampler, args=(samples, stop, start, mine), daemon=True)
        watcher.start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_time_plugin",
                               *rest], cwd=ROOT, env=env)
        wall = time.monotonic() - start
        stop.set()
        watcher.join()
        last = read_cpu_times(mine)
        if last:
            samples.append((wall, *last))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        work = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        book = read_book_times(book_times, start)
        tests = [json.loads(l) for l in tests_log.read_text().splitlines()] if tests_log.is_file() else []

    b = bounds(wall, work, cpus)
    print(f"\nthe suite on {cpu_model()}, {cpus} usable CPUs; pytest exit status {done.returncode}")
    print(f"wall clock           {wall:7.1f} s")
    print(f"work                 {work:7.1f} CPU-s (pytest and the processes it waited for, theirs included)")
    if len(samples) > 1:
        seen = cpus * (samples[-1][1] - samples[0][1]) / (samples[-1][2] - samples[0][2]) * wall
        print(f"busy, whole machine  {seen:7.1f} CPU-s on its CPUs {sorted(mine)} (/proc/stat: any process; "
              "more than the work where some of the suite's were never waited for, or others ran)")
    print(f"bound: work / CPUs   {b['bound']:7.1f} s   idle {b['idle']:.1f} CPU-s ({b['idle'] / (cpus * wall):.0%})")
    if b["idle"] < 0:
        print("warning: more work than the CPUs could do in this wall clock; the CPUs counted are not all that ran it")
    if "start" in book and "book" not in book:
        print(f"quick book           started at {book['start']['at']:.1f} s and noted no end (it failed or was stopped)")
    elif "book" in book:
        end = max(v["at"] for v in book.values())
        print(f"quick book           started at {book['start']['at']:6.1f} s, ended at {book['book']['at']:6.1f} s, "
              f"{book['book']['cpu']:6.1f} CPU-s")
        if "leg" in book:
            print(f"no-kernel leg        ended at {book['leg']['at']:6.1f} s, "
                  f"{book['leg']['cpu'] - book['book']['cpu']:6.1f} CPU-s")
        book_cpu = max(v["cpu"] for v in book.values())
        print(f"the session's tests  {work - book_cpu:7.1f} CPU-s; after the book process ended, {wall - end:.1f} s more")
    else:
        print("no quick book ran beside the tests (no selected test reads a chapter)")
    if len(samples) > 1:
        row = busy_cpus(samples, cpus, args.every)
        print(f"busy CPUs per {args.every:g} s (the last stretch may be partial): "
              + " ".join(f"{t:.0f}:{v:.2f}" for t, v in row))
    files = work_by_file(tests)
    if files:
        inside = sum(r[3] + r[4] for r in files)
        print(f"work by test file, the most first: the pytest process's CPU-s, and its children's, charged to the test "
              f"that collected them (the quick book's to the one that waits for its end, or to the last); "
              f"{inside:.1f} CPU-s in tests, {work - inside:.1f} outside any (start-up, collection, exit; "
              "children never collected); session fixtures count in their first test:")
    for name, n, seconds, own, children in files[:args.longest]:
        print(f"  {own:6.1f} + {children:6.1f} CPU-s  {seconds:6.1f} s  {n:4d} tests  {name}")
    calls = sorted(((t["end"] - t["start"], t["cpu"] + t["children"], t["id"], t["start"] - start) for t in tests),
                   reverse=True)
    if calls:
        print("the longest tests, setup to teardown (session fixtures and waits for the book included):")
    for seconds, cpu, name, at in calls[:args.longest]:
        print(f"  {seconds:6.1f} s  {cpu:6.1f} CPU-s  from {at:6.1f} s  {name}")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
