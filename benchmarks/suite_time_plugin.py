"""suite_time.py's pytest plugin: each test's start and end (setup to teardown), on the
system-wide monotonic clock (time.monotonic), one JSON line per test in the file $SUITE_TIME_TESTS."""
from __future__ import annotations

import json
import os
import time

import pytest

TESTS_ENV = "SUITE_TIME_TESTS"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.monotonic()
    yield
    path = os.environ.get(TESTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"id": item.nodeid, "start": start, "end": time.monotonic()}) + "\n")
