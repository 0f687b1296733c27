"""The quick book's process notes when its phases end, for benchmarks/suite_time.py: a module
of its own, light to import (the book's process imports it; so does the test of it)."""
from __future__ import annotations

import json
import os
import resource
import time

TIMES_ENV = "ATTENTION_DYNAMICS_SUITE_TIMES"


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, all its threads; those of the children it has waited for)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def note_time(phase: str) -> None:
    """Where $ATTENTION_DYNAMICS_SUITE_TIMES names a file, add when ``phase`` ended
    (time.monotonic: one clock for every process on Linux) and this process's CPU seconds
    then, those of the children it has waited for included."""
    path = os.environ.get(TIMES_ENV)
    if not path:
        return
    cpu = sum(cpu_seconds())
    with open(path, "a") as f:
        f.write(json.dumps({"phase": phase, "time": time.monotonic(), "cpu": cpu}) + "\n")
