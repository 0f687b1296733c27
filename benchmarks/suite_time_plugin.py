"""suite_time.py's pytest plugin: each test's start and end (setup to teardown), on the
system-wide monotonic clock (time.monotonic), and its work: the CPU seconds of the pytest
process and of the children it waited for meanwhile (getrusage). A child is counted when it
is waited for: the quick book's process, started at the session's first test, counts whole
(book and leg) in the test that waits for its end (the no-kernel leg's, in test_chapters.py),
and in no test where none does. One JSON line per test in the file $SUITE_TIME_TESTS."""
from __future__ import annotations

import json
import os
import resource
import time

import pytest

TESTS_ENV = "SUITE_TIME_TESTS"


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, cpu = time.monotonic(), _cpu()
    yield
    path = os.environ.get(TESTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"id": item.nodeid, "start": start, "end": time.monotonic(), "cpu": _cpu() - cpu}) + "\n")
