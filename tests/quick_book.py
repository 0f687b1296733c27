"""The quick book's chapters, executed in a process of their own while the test session runs
the tests that do not read them (conftest.quick_runs):

    python quick_book.py [--stop-with-stdin] [--nice N] ROOT OUT RESULTS NAME [NAME ...] [--then-without-kernels OUT2 RESULTS2]

runs the named chapters at the quick profile into OUT, side by side as the runner does, and
writes RESULTS: chapter name -> its record and the stored models its plan made first. With
``--then-without-kernels``, the chapters among them that ran a compiled kernel then run again
with every kernel off (ATTENTION_DYNAMICS_NATIVE=0, in a fresh process, so that no choice of
path made in this one is inherited) into OUT2, their records in RESULTS2 (empty when no
kernel ran). A process, not a thread of the session: a thread's process pool would fork a
process whose other threads are running tests, and its kernels would see whatever
environment a test had patched at the time. ``--stop-with-stdin``: the whole process group
is killed when stdin closes (the session's end, however it ends). ``--nice N``: the book runs
N steps nicer, its chapters' kernels too (attention_dynamics.book.kernel.carry_into_session), so that the
session's own tests, which run one after another and set the suite's end, are not slowed by
it (conftest's choice)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.scheduling import lower_priority, run_chapters
from attention_dynamics.files import write_json_atomic
from suite_times import TIMES_ENV, note_time


def run(root: str, out: str, results: str, names: list[str]) -> dict:
    runs = run_chapters(make_jobs(Path(root), "quick", only=names, out_dir=Path(out)), progress=False)
    done = {r.name: {"record": r.record, "planned": list(r.planned), "planned_failed": list(r.planned_failed)}
            for r in runs}
    write_json_atomic(Path(results), done)
    return done


def ran_a_kernel(record: dict) -> bool:
    return any(p.startswith("kernel") for p in record["provenance"]["paths"].values())


def _die_with_the_session() -> None:
    """The session holds this process's stdin open; when it ends without stopping the book
    (pytest killed, however), stdin closes and the book stops with it, pool and all."""
    # the pipe read on a file descriptor of its own, below any Python lock: the process pool
    # forks while this thread waits, and a forked child closes sys.stdin (multiprocessing's
    # bootstrap), which hung on the lock of a sys.stdin being read
    pipe = os.dup(0)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)

    def watch():
        while os.read(pipe, 4096):
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str]) -> None:
    then = None
    if "--then-without-kernels" in argv:
        i = argv.index("--then-without-kernels")
        argv, then = argv[:i], argv[i + 1:i + 3]
    if argv[:1] == ["--stop-with-stdin"]:  # conftest's: this process leads the book's own process group
        argv = argv[1:]
        _die_with_the_session()
    if argv[:1] == ["--nice"]:
        lower_priority(int(argv[1]))
        argv = argv[2:]
    root, out, results, *names = argv
    note_time("start")
    done = run(root, out, results, names)
    note_time("book")
    if then is None:
        return
    used = sorted(n for n, r in done.items() if ran_a_kernel(r["record"]))
    if not used:
        write_json_atomic(Path(then[1]), {})
        return
    env = {k: v for k, v in os.environ.items() if k != TIMES_ENV}  # its time is noted here, as the leg's
    leg = subprocess.run([sys.executable, __file__, root, *then, *used], stdin=subprocess.DEVNULL,
                         env=dict(env, ATTENTION_DYNAMICS_NATIVE="0"))
    note_time("leg")
    sys.exit(leg.returncode)  # RESULTS2 is missing where it failed; RESULTS stands


if __name__ == "__main__":
    main(sys.argv[1:])
