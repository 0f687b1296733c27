"""A niced runner's kernels stay niced where Linux shares the CPUs by session
(attention_dynamics.book.kernel.carry_into_session): each kernel starts a session, hence an
autogroup of its own, which would otherwise be at nice 0."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attention_dynamics.book import kernel
from attention_dynamics.book.scheduling import lower_priority

ROOT = Path(__file__).resolve().parents[1]


def _autogroups() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1" and kernel.AUTOGROUP.exists()
    except OSError:
        return False


needs_autogroups = pytest.mark.skipif(not _autogroups(), reason="this system does not share the CPUs by session")
# the expected niceness below is absolute: a suite started niced would read it shifted
from_nice_0 = pytest.mark.skipif(os.getpriority(os.PRIO_PROCESS, 0) != 0, reason="the test session is niced")


def _in_new_session(code: str) -> dict:
    """What ``code`` prints (JSON) when run in a fresh process that leads a session of its own."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         start_new_session=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


READ = "open('/proc/self/autogroup').read().split()[-1]"


@needs_autogroups
@from_nice_0
def test_a_new_session_is_at_nice_0_whatever_the_process_and_carrying_gives_it_the_process_niceness():
    """The negative control is the problem itself: niced, then a session of its own, and the
    autogroup reads 0; carried, it reads the niceness."""
    got = _in_new_session(f"""
        import json, os
        from attention_dynamics.book import kernel
        os.nice(3)
        before = int({READ})
        carried = kernel.carry_into_session()
        print(json.dumps({{"before": before, "carried": carried, "after": int({READ}), "nice": os.getpriority(os.PRIO_PROCESS, 0)}}))
    """)
    assert got == {"before": 0, "carried": True, "after": 3, "nice": 3}


def test_nothing_is_written_at_nice_0_nor_by_a_process_that_does_not_lead_its_session(tmp_path, monkeypatch):
    file = tmp_path / "autogroup"
    file.write_text("/autogroup-1 nice 0\n")
    monkeypatch.setattr(kernel, "AUTOGROUP", file)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 0)
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid())
    assert kernel.carry_into_session() is False
    monkeypatch.setattr(os, "getpriority", lambda which, who: 7)
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid() + 1)  # a session someone else leads
    assert kernel.carry_into_session() is False
    assert file.read_text() == "/autogroup-1 nice 0\n"
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid())
    assert kernel.carry_into_session() is True and file.read_text() == "7"


class _Refusing:
    """An autogroup file that refuses its first writes with the given error codes."""

    def __init__(self, codes, tries):
        self.codes, self.tries = list(codes), tries

    def exists(self):
        return True

    def write_text(self, text):
        self.tries.append(text)
        if self.codes:
            raise OSError(self.codes.pop(0), "refused")


def test_the_kernels_throttle_is_waited_out_for_every_process_that_may_start_at_once(monkeypatch, capsys):
    """Linux lets one autogroup change through per 100 ms: with 8 usable CPUs, up to 8 workers
    each start a kernel and a template, so the 16 changes and 5 more are waited out; one
    refusal more is given up with a note, and a refusal other than the throttle at once."""
    import errno

    monkeypatch.setattr(os, "getpriority", lambda which, who: 5)
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(kernel, "_AUTOGROUP_RETRY_WAIT_S", 0.0)
    attempts = kernel._AUTOGROUP_RETRIES + 2 * 8
    assert kernel._autogroup_attempts() == attempts
    tries = []
    monkeypatch.setattr(kernel, "AUTOGROUP", _Refusing([errno.EAGAIN] * (attempts - 1), tries))
    assert kernel.carry_into_session() is True and len(tries) == attempts
    assert capsys.readouterr().err == ""
    tries.clear()
    monkeypatch.setattr(kernel, "AUTOGROUP", _Refusing([errno.EAGAIN] * attempts, tries))
    assert kernel.carry_into_session() is False and len(tries) == attempts
    assert f"Linux refused {attempts} changes of its autogroup" in capsys.readouterr().err
    tries.clear()
    monkeypatch.setattr(kernel, "AUTOGROUP", _Refusing([errno.EPERM], tries))
    assert kernel.carry_into_session() is False and len(tries) == 1
    assert capsys.readouterr().err == ""


def test_a_carry_for_another_process_waits_in_a_thread_not_in_the_caller(monkeypatch):
    """The runner starts a kernel and goes on while the change waits (on the throttle; here on
    an event the test holds): the caller has the thread back with the write still pending."""
    import threading
    from pathlib import Path

    release, written = threading.Event(), []

    class Held:
        def __init__(self, path):
            self.path = path

        def exists(self):
            return True

        def write_text(self, text):
            assert release.wait(60)
            written.append((self.path, text))

    monkeypatch.setattr(kernel, "Path", Held)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 6)
    monkeypatch.setattr(os, "getsid", lambda pid: pid)
    thread = kernel.carry_into_session_soon(4242)
    assert thread.daemon and thread.is_alive() and written == []
    release.set()
    thread.join(60)
    assert not thread.is_alive() and written == [("/proc/4242/autogroup", "6")]


@pytest.mark.parametrize("steps", [0, 20, -1, 2.0, True, "3"])
def test_lower_priority_names_its_range(steps):
    with pytest.raises(ValueError, match=r"steps must be an integer from 1 to 19"):
        lower_priority(steps)


@needs_autogroups
@from_nice_0
def test_a_niced_runners_kernels_plain_and_forked_run_at_its_niceness():
    """A runner that lowered its priority by 4 executes a chapter in a plain kernel and in
    one forked from a template: in both the kernel's own niceness and its autogroup's are 4,
    and so are the runner's own autogroup (lower_priority's carry) and the template's (its
    parent's carry after Popen)."""
    cells = [("code", 'x = 1\nrecord_path = ""\nprofile = "paper"', ["parameters"]),
             ("code", "import os\nimport numpy\nfrom attention_dynamics.book.records import Record\n"
                      "rec = Record(record_path)\nrec['nice'] = os.getpriority(os.PRIO_PROCESS, 0)\n"
                      f"rec['group'] = int({READ})\n"
                      "rec['forked'] = '--template' in __import__('sys').orig_argv\nrec.save()", [])]
    got = _in_new_session(f"""
        import json, sys, tempfile
        from pathlib import Path
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from support import make_root
        from attention_dynamics.book import execution
        from attention_dynamics.book.execution import execute
        from attention_dynamics.book.jobs import make_jobs
        from attention_dynamics.book.scheduling import lower_priority

        runner = lower_priority(4)
        runner_group = int({READ})
        tmp = Path(tempfile.mkdtemp())
        root = make_root(tmp, {cells!r})
        got = {{"runner": runner, "runner_group": runner_group}}
        (job,) = make_jobs(root, "quick", out_dir=tmp / "forked")
        got["forked"] = execute(job).record["values"]
        from attention_dynamics.book import templates
        got["templates"] = [int(open(f"/proc/{{t.process.pid}}/autogroup").read().split()[-1])
                            for t in templates._templates.values()]
        execution.preloaded_for = lambda notebook: ()  # nothing to preload: a plain kernel
        (job,) = make_jobs(root, "quick", out_dir=tmp / "plain")
        got["plain"] = execute(job).record["values"]
        print(json.dumps(got))
    """)
    assert got == {"runner": 4, "runner_group": 4, "templates": [4], "forked": {"nice": 4, "group": 4, "forked": True},
                   "plain": {"nice": 4, "group": 4, "forked": False}}, got
