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


class _Autogroup:
    """The autogroup file faked: each open is a descriptor of /dev/null (so that its close is
    real), each write recorded as (pid, text), the first ones refused with ``codes``."""

    def __init__(self, monkeypatch, codes=(), hold=None):
        self.codes, self.hold, self.tries, self.opened = list(codes), hold, [], []
        monkeypatch.setattr(kernel, "_open_autogroup", self._open)
        monkeypatch.setattr(kernel, "_write_autogroup", self._write)

    def _open(self, pid):
        fd = os.open(os.devnull, os.O_WRONLY)
        self.opened.append(fd)
        self.pid = pid
        return fd

    def _write(self, fd, text):
        assert fd in self.opened
        if self.hold is not None:
            assert self.hold.wait(60)
        self.tries.append((self.pid, text))
        if self.codes:
            raise OSError(self.codes.pop(0), "refused")

    def all_closed(self) -> bool:
        for fd in self.opened:
            try:
                os.fstat(fd)
            except OSError:
                continue
            return False
        return True


def test_nothing_is_written_at_nice_0_nor_by_a_process_that_does_not_lead_its_session(monkeypatch):
    group = _Autogroup(monkeypatch)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 0)
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid())
    assert kernel.carry_into_session() is False
    monkeypatch.setattr(os, "getpriority", lambda which, who: 7)
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid() + 1)  # a session someone else leads
    assert kernel.carry_into_session() is False
    assert group.tries == []
    monkeypatch.setattr(os, "getsid", lambda pid: os.getpid())
    assert kernel.carry_into_session() is True and group.tries == [(0, "7")]
    assert len(group.opened) == 3 and group.all_closed()


def test_a_process_without_an_autogroup_file_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel, "AUTOGROUP", tmp_path / "missing")
    assert kernel._open_autogroup(0) is None and kernel.carry_into_session() is False


@needs_autogroups
def test_a_descriptor_held_across_the_retries_refuses_a_write_once_its_process_has_ended():
    """Why the file is opened once: after the process has ended (and been reaped, its pid free
    for another), a write through the descriptor answers ESRCH; a path opened again would
    reach whichever process has that pid now."""
    import errno

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    fd = kernel._open_autogroup(child.pid)
    assert fd is not None
    try:
        child.stdin.close()
        child.wait(60)
        with pytest.raises(OSError) as e:
            kernel._write_autogroup(fd, "0")
        assert e.value.errno == errno.ESRCH
    finally:
        os.close(fd)


def test_the_kernels_throttle_is_waited_out_for_every_process_that_may_start_at_once(monkeypatch, capsys):
    """Linux lets one autogroup change through per 100 ms: with 8 usable CPUs, up to 8 workers
    each start a kernel and a template, so 16 changes and 5 more may queue. The patience is
    twice their time at one per round (2 x 21 x 0.11 s); the queue is waited out even where
    every wait is drawn at its longest (1.5 x 0.11 s); past the patience the carry gives up with
    a note that names the process; a refusal other than the throttle gives up at once. On a
    clock of the test's (kernel._now, kernel._wait): the waits advance it, nothing sleeps."""
    import errno
    import random

    monkeypatch.setattr(os, "getpriority", lambda which, who: 5)
    monkeypatch.setattr(os, "getsid", lambda pid: pid or os.getpid())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    queued = kernel._AUTOGROUP_RETRIES + 2 * 8
    patience = kernel._autogroup_patience_s()
    assert patience == pytest.approx(2 * queued * kernel._AUTOGROUP_RETRY_WAIT_S)
    now, waits = [0.0], []

    def wait(s):
        waits.append(s)
        now[0] += s

    monkeypatch.setattr(kernel, "_now", lambda: now[0])
    monkeypatch.setattr(kernel, "_wait", wait)

    class Longest(random.Random):
        def uniform(self, a, b):
            return b

    def carry(codes, pid=0, role="this process", draws=random.Random):
        group = _Autogroup(monkeypatch, codes)
        now[0], waits[:] = 0.0, []
        with monkeypatch.context() as m:
            m.setattr(random, "Random", draws)
            got = kernel.carry_into_session(pid, role)
        assert len(group.opened) == 1 and group.all_closed()  # one descriptor for all the tries
        return got, group.tries

    shortest, longest = 0.5 * kernel._AUTOGROUP_RETRY_WAIT_S, 1.5 * kernel._AUTOGROUP_RETRY_WAIT_S
    got, tries = carry([errno.EAGAIN] * queued)
    assert got is True and len(tries) == queued + 1 and capsys.readouterr().err == ""
    assert all(shortest <= w <= longest for w in waits) and len(set(waits)) > 1  # drawn, not fixed
    got, tries = carry([errno.EAGAIN] * queued, draws=Longest)
    assert got is True and len(tries) == queued + 1 and waits == [longest] * queued
    got, tries = carry([errno.EAGAIN] * 10_000, pid=4242, role="a kernel template")
    assert got is False and patience <= now[0] < patience + longest
    assert len(tries) >= patience / longest and all(t == (4242, "5") for t in tries)
    err = capsys.readouterr().err
    assert "note: a kernel template (pid 4242) runs at nice 5" in err, err
    assert f"Linux refused {len(tries)} changes of its autogroup over {patience:.1f} s" in err, err
    got, tries = carry([errno.EPERM])
    assert got is False and len(tries) == 1 and capsys.readouterr().err == ""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert kernel._autogroup_patience_s() == pytest.approx(2 * (kernel._AUTOGROUP_RETRIES + 2) * kernel._AUTOGROUP_RETRY_WAIT_S)


def test_a_carry_for_another_process_waits_in_a_thread_not_in_the_caller(monkeypatch):
    """The runner starts a kernel and goes on while the change waits (on the throttle; here on
    an event the test holds): the caller has the thread back with the write still pending."""
    import threading

    release = threading.Event()
    group = _Autogroup(monkeypatch, hold=release)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 6)
    monkeypatch.setattr(os, "getsid", lambda pid: pid)
    over = threading.Event()
    thread = kernel.carry_into_session_soon(4242, "a chapter's kernel", then=over.set)
    assert thread.daemon and thread.is_alive() and group.tries == [] and not over.is_set()
    release.set()
    thread.join(60)
    assert not thread.is_alive() and group.tries == [(4242, "6")] and over.is_set()


def test_then_is_called_however_the_carry_ended(monkeypatch):
    """A carry that raises (here: the write) still calls ``then``: a launch waiting on it
    would otherwise wait for ever."""
    import threading

    def broken(fd, text):
        raise ValueError("planted")

    group = _Autogroup(monkeypatch)
    monkeypatch.setattr(kernel, "_write_autogroup", broken)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 6)
    monkeypatch.setattr(os, "getsid", lambda pid: pid)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the planted error, not printed
    over = threading.Event()
    kernel.carry_into_session_soon(4242, "a chapter's kernel", then=over.set).join(60)
    assert over.is_set() and group.all_closed()


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


def test_then_is_called_where_no_thread_can_start(monkeypatch):
    import threading

    def refused(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    over = []
    assert kernel.carry_into_session_soon(4242, "a chapter's kernel", then=lambda: over.append(True)) is None
    assert over == [True]
