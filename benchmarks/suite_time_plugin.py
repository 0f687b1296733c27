"""suite_time.py's pytest plugin: each test's start and end (setup to teardown), on the
system-wide monotonic clock (time.monotonic), and its work: the CPU seconds of the pytest
process (all its threads, whatever they ran meanwhile) and, apart, of the children collected
meanwhile (getrusage). A child's work is charged to the test during which it is collected,
not to the one that started it: the quick book's process, started at the session's first
test, counts whole (book and leg) in the test that waits for its end (the no-kernel leg's,
in test_chapters.py) or in the last test, whose teardown ends the session's fixtures; a
child never collected (a process left to exit with pytest) counts in none. Session fixtures
count in the first test that asks for them. One JSON line per test in $SUITE_TIME_TESTS."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # loaded (-p) before any conftest
from suite_times import cpu_seconds  # noqa: E402

TESTS_ENV = "SUITE_TIME_TESTS"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (own, children) = time.monotonic(), cpu_seconds()
    yield
    path = os.environ.get(TESTS_ENV)
    if path:
        own_after, children_after = cpu_seconds()
        with open(path, "a") as f:
            f.write(json.dumps({"id": item.nodeid, "start": start, "end": time.monotonic(), "cpu": own_after - own,
                                "children": children_after - children}) + "\n")
