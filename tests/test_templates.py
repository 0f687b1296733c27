"""Kernels forked from a template (attention_dynamics.book.templates): the runner manages them
as the kernels it starts itself (their status, their end with the runner), one template serves
one environment and folder, and where a template cannot serve, the chapter still runs, started
the plain way, with one note. What a chapter sees in a forked kernel: tests/test_kernel.py;
the runner's faults in one: tests/test_runner_faults.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from attention_dynamics.book import templates
from attention_dynamics.book.execution import execute
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.templates import ForkedKernel, KernelTemplate
from support import TINY_CELLS, forked_kernels, loading, make_root

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="templates serve on Linux only")

# a notebook that imports a library the runner's kernel loads first: its kernel is forked
LOADING_CELLS = loading(TINY_CELLS)


def _child(code: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            exec(code, {"os": os, "signal": signal, "time": time})
        finally:
            os._exit(0)
    return pid


@pytest.mark.parametrize("code, status", [("os._exit(3)", 3), ("os.kill(os.getpid(), signal.SIGKILL)", -9),
                                          ("time.sleep(60)", None)])
def test_a_forked_kernels_status_reads_as_popens(code, status):
    """Exit codes as they are, a signal as its negative number, None while it runs;
    terminate and kill as Popen's, a wait that times out as Popen's."""
    a = ForkedKernel(_child(code))
    b = subprocess.Popen([sys.executable, "-c", f"import os, signal, time\n{code}"])
    if status is None:
        time.sleep(0.2)
        assert a.poll() is None and b.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            a.wait(timeout=0.1)
        a.terminate()
        b.terminate()
        status = -signal.SIGTERM
    assert a.wait(timeout=30) == b.wait(timeout=30) == status
    assert a.poll() == status and a.returncode == status
    a.kill()  # a process that has ended is not signalled again: its pid may be another's now


class FakeTemplate:
    """The registry's view of a template, without a process."""
    made: list = []

    def __init__(self, preload, env, cwd):
        self.env, self.closed, self.fail = env, False, env.get("FAIL") == "1"
        self.socket, self.lock, self.users = __import__("socket").socket(), __import__("threading").Lock(), 0
        FakeTemplate.made.append(self)

    def alive(self):
        return not self.closed

    def fork_kernel(self, argv, env, cwd):
        if self.fail:
            raise templates.TemplateFailed("it broke")
        return 4242

    def close(self):
        self.closed = True


@pytest.fixture
def fake_templates(monkeypatch):
    FakeTemplate.made = []
    monkeypatch.setattr(templates, "KernelTemplate", FakeTemplate)
    monkeypatch.setattr(templates, "_templates", {})
    monkeypatch.setattr(templates, "_failed", set())
    monkeypatch.setattr(templates, "_make_subreaper", lambda: None)
    return FakeTemplate.made


def test_one_template_serves_one_environment_and_folder(fake_templates):
    """The kernel's own JPY_* variables do not split; any other variable or the folder does
    (JPY_PARENT_PID is the same for all of a process's kernels, and ipykernel reads it as it loads);
    at most MAX_TEMPLATES are kept, the least recently used closed first."""
    def fork(cwd="/a", **env):
        return templates.fork_kernel(("numpy",), ["-f", "c.json"], {"PATH": "/bin", "JPY_PARENT_PID": "1", **env}, cwd)

    assert fork() == fork(JPY_SESSION_NAME="x") == 4242
    assert len(fake_templates) == 1 and fake_templates[0].env["JPY_PARENT_PID"] == "1"
    assert "JPY_SESSION_NAME" not in fake_templates[0].env
    fork(OMP_NUM_THREADS="2")
    assert len(fake_templates) == 2
    fork()  # the first again: now the most recently used
    fork(cwd="/b")
    assert len(fake_templates) == 3 == templates.MAX_TEMPLATES + 1
    assert [t.closed for t in fake_templates] == [False, True, False]


def test_a_template_that_failed_is_not_started_again(fake_templates):
    with pytest.raises(templates.TemplateFailed, match="it broke"):
        templates.fork_kernel(("numpy",), [], {"FAIL": "1"}, "/a")
    with pytest.raises(templates.TemplateFailed, match="failed before"):
        templates.fork_kernel(("numpy",), [], {"FAIL": "1"}, "/a")
    assert len(fake_templates) == 1 and fake_templates[0].closed
    assert templates.fork_kernel(("numpy",), [], {}, "/a") == 4242  # another environment's serves


def test_a_forked_child_of_the_runner_forgets_its_templates(fake_templates):
    """A pool's worker, forked from the runner, must not share the runner's template socket."""
    templates.fork_kernel(("numpy",), [], {}, "/a")
    assert templates._templates
    pid = os.fork()
    if pid == 0:
        os._exit(0 if templates._templates == {} else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert templates._templates  # the runner's own are kept


def test_a_template_that_cannot_start_leaves_the_plain_kernel_with_one_note(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(KernelTemplate, "module", "attention_dynamics.book.no_such_module")
    monkeypatch.setattr(templates, "_templates", {})
    monkeypatch.setattr(templates, "_failed", set())
    root = make_root(tmp_path, LOADING_CELLS)
    for run in range(2):
        (job,) = make_jobs(root, "quick", out_dir=tmp_path / f"out{run}")
        assert execute(job).record["values"] == {"double": 6}
    err = capfd.readouterr().err
    assert err.count("note: the kernel template") == 1, err
    assert "did not answer: it exited with status 1; starting kernels of this environment the plain way" in err
    assert "No module named attention_dynamics.book.no_such_module" in err  # the template's own words


def test_a_template_that_died_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(templates, "_templates", {})
    root = make_root(tmp_path, LOADING_CELLS)
    pids = []
    for run in range(2):
        (job,) = make_jobs(root, "quick", out_dir=tmp_path / f"out{run}")
        assert execute(job).record["values"] == {"double": 6}
        (t,) = templates._templates.values()
        pids.append(t.process.pid)
        t.process.kill()
        t.process.wait()
    assert pids[0] != pids[1]


def _gone(pid: int) -> bool:
    """Ended: not running, and reaped here where this process adopted it (a subreaper)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _forked_here() -> set[int]:
    """The live templates and forked kernels that are this process's children (a forked
    kernel has its template's command line)."""
    found = set()
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{d}/cmdline", "rb") as f:
                ours = b"\0--template\0" in f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ours and int(ppid) == os.getpid() and state != "Z":
            found.add(int(d))
    return found


def test_an_interrupted_request_closes_the_template_which_kills_its_kernel(tmp_path, monkeypatch):
    """A request cut short after the kernel's pid came back and before it was acknowledged
    (here a KeyboardInterrupt) closes the template: the kernel it forked for that request is
    killed, not left to run unmanaged, and the next chapter gets a template of its own."""
    monkeypatch.setattr(templates, "_templates", {})
    root = make_root(tmp_path, LOADING_CELLS)
    real = templates.read_message
    seen = []

    def interrupted(sock):
        (t,) = templates._templates.values()
        seen.append(t.process.pid)
        seen.append(real(sock)["pid"])  # the kernel is forked and its pid read, not acknowledged
        raise KeyboardInterrupt

    monkeypatch.setattr(templates, "read_message", interrupted)
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out0")
    before = _forked_here()  # other tests' templates, which live on
    with pytest.raises(KeyboardInterrupt):
        execute(job)
    template, kernel = seen
    deadline = time.monotonic() + 30
    while (not _gone(template) or _forked_here() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(template) and _gone(kernel) and _forked_here() - before == set()
    monkeypatch.setattr(templates, "read_message", real)
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out1")
    assert execute(job).record["values"] == {"double": 6}
    # an interruption is not a failure: the environment gets a template again
    (t,) = templates._templates.values()
    assert t.process.pid != template


def test_a_large_environment_reaches_the_kernel_whole(tmp_path, monkeypatch):
    """The request carries the whole environment: here 400 kB, more than one send takes (a
    socket's buffer holds about 200 kB; one variable may not pass 128 kB, exec's limit)."""
    monkeypatch.setattr(templates, "_templates", {})
    for i in range(4):
        monkeypatch.setenv(f"LARGE{i}", "x" * 100_000)
    cells = loading([*TINY_CELLS[:-1],
                     ("code", "import os\nrec['double'] = 2 * x + offset\n"
                              "rec['large'] = sum(len(v) for k, v in os.environ.items() if k.startswith('LARGE'))\n"
                              "rec.save()", [])])
    pids = forked_kernels(monkeypatch)
    (job,) = make_jobs(make_root(tmp_path, cells), "quick", out_dir=tmp_path / "out")
    assert execute(job).record["values"] == {"double": 6, "large": 400_000} and len(pids) == 1


def test_a_forked_kernel_runs_pytorch_on_the_threads_its_environment_names(tmp_path, monkeypatch):
    """Two threads, as a build with one worker gives them: the forked kernel's PyTorch and
    numpy's BLAS start their pools after the fork (OpenBLAS's, started as numpy loads, stops at
    a fork and starts again when next used), as many threads as the plain kernel's, and the
    parallel work is the same."""
    from attention_dynamics.book import execution

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(templates, "_templates", {})
    cells = [TINY_CELLS[0], ("code", "import os, threading\nimport numpy, torch", []), TINY_CELLS[1],
             ("code", "torch.manual_seed(0)\na = torch.randn(512, 512)\n"
                      "rec['product'] = (a @ a).sum().item()\nrec['threads'] = torch.get_num_threads()\n"
                      "b = numpy.random.default_rng(0).normal(size=(512, 512))\nrec['numpy'] = float((b @ b).sum())\n"
                      "rec['native'] = len(os.listdir('/proc/self/task')) - threading.active_count()\n"
                      "rec['forked'] = '--template' in __import__('sys').orig_argv\nrec.save()", [])]
    root = make_root(tmp_path, cells)
    got = {}
    for kernel in ("plain", "forked"):
        with monkeypatch.context() as m:
            if kernel == "plain":
                m.setattr(execution, "preloaded_for", lambda notebook: ())
            (job,) = make_jobs(root, "quick", out_dir=tmp_path / kernel)
            got[kernel] = execute(job).record["values"]
    assert [got[k].pop("forked") for k in ("plain", "forked")] == [False, True]
    assert got["forked"] == got["plain"] and got["plain"]["threads"] == 2, got


def test_a_template_and_its_kernel_end_with_the_runners_process(tmp_path):
    """A runner killed outright: its template sees its socket close and exits, and its kernel
    sees its parent change (ipykernel's own check) and exits. This process adopts them (a
    subreaper, as the runner's is), so that the kernel's own fallback, ending when its parent
    is init, cannot be what ends it."""
    templates._make_subreaper()
    script = tmp_path / "runner.py"
    script.write_text(textwrap.dedent("""
        import asyncio, os, sys
        from attention_dynamics.book import templates
        from attention_dynamics.book.execution import kernel_manager

        async def main():
            km = kernel_manager(("numpy",))(kernel_name="python3")
            await km.start_kernel()
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=120)
            (t,) = templates._templates.values()
            open(sys.argv[1], "w").write(f"{t.process.pid} {km.provisioner.pid}")
            os.kill(os.getpid(), 9)

        asyncio.run(main())
    """))
    # into files: a kernel or template that outlived the runner would hold a pipe open
    pids, log = tmp_path / "pids", tmp_path / "log"
    with open(log, "w") as err:
        done = subprocess.run([sys.executable, str(script), str(pids)], stdout=err, stderr=err, timeout=300)
    assert done.returncode == -signal.SIGKILL, log.read_text()
    template, kernel = map(int, pids.read_text().split())
    deadline = time.monotonic() + 30
    while not (_gone(template) and _gone(kernel)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(template) and _gone(kernel)


def test_the_template_option_takes_a_value():
    done = subprocess.run([sys.executable, "-m", "attention_dynamics.book.kernel", "--preload", "numpy", "--template"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--template takes its value as the next argument" in done.stderr


def test_a_switch_that_is_neither_0_nor_1_is_named(tmp_path, monkeypatch):
    from attention_dynamics.book.jobs import NotebookFailed

    monkeypatch.setenv(templates.SWITCH, "yes")
    (job,) = make_jobs(make_root(tmp_path, LOADING_CELLS), "quick", out_dir=tmp_path / "out")
    with pytest.raises(NotebookFailed, match="ATTENTION_DYNAMICS_KERNEL_TEMPLATE must be '0' or '1', got 'yes'"):
        execute(job)
    assert not (tmp_path / "out" / "tiny.json").exists()


def test_a_plain_kernel_is_handed_back_once_its_niceness_is_carried_and_the_loop_runs_meanwhile(monkeypatch):
    """jupyter_client's start (faked) returns; the carry into the kernel's session waits (here
    on an event the test holds, as on Linux's throttle); the launch is not done until the
    carry is, and another task of the loop runs in between (the one that releases it)."""
    import asyncio
    import threading

    from jupyter_client.provisioning import LocalProvisioner

    release, carried = threading.Event(), []

    async def started(self, cmd, **kwargs):
        self.pid = 4242
        return {"started": cmd}

    def carry(pid, role, then):
        def wait():
            assert release.wait(60)
            carried.append((pid, role))
            then()

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        return thread

    monkeypatch.setattr(LocalProvisioner, "launch_kernel", started)
    monkeypatch.setattr(templates, "carry_into_session_soon", carry)

    async def main():
        launch = asyncio.ensure_future(templates.ChapterProvisioner(kernel_id="k")._launch_plain(["kernel"]))
        await asyncio.sleep(0.2)
        pending = not launch.done()
        release.set()
        return pending, await asyncio.wait_for(launch, 60)

    pending, info = asyncio.run(main())
    assert pending and info == {"started": ["kernel"]} and carried == [(4242, "a chapter's kernel")]


FORKED_WORKER = """
import asyncio, os, signal, sys
from jupyter_core.utils import run_sync
from jupyter_client.provisioning import LocalProvisioner
from attention_dynamics.book import templates

async def started(self, cmd, **kwargs):
    self.pid = os.getpid()
    return {}

LocalProvisioner.launch_kernel = started
run_sync(asyncio.to_thread)(lambda: None)  # the runner's loop (jupyter_core's, kept per thread) has used its default executor
pid = os.fork()  # a pool's worker
if pid == 0:
    signal.alarm(int(sys.argv[2]))
    if sys.argv[1] == "to_thread":
        run_sync(asyncio.to_thread)(lambda: None)
    else:
        run_sync(templates.ChapterProvisioner(kernel_id="k")._launch_plain)(["kernel"])
    os._exit(0)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.mark.parametrize("how, alarm_s, status", [("the launch", 60, 0), ("to_thread", 3, -signal.SIGALRM)])
def test_a_plain_kernel_starts_in_a_worker_forked_from_a_runner_whose_loop_used_its_executor(how, alarm_s, status):
    """The launch in a forked child of a process whose event loop (jupyter_core's run_sync keeps
    one per thread; papermill and jupyter_client run on it) had used its default executor, the
    child's loop not replaced: it returns (status 0). The negative control is the hazard the
    launch avoids: asyncio.to_thread there waits until the alarm ends it, the executor
    counting an idle thread the fork did not copy (a false alarm here, should jupyter_core
    ever stop handing the loop to a forked child, fails this case, never passes a broken launch)."""
    done = subprocess.run([sys.executable, "-c", FORKED_WORKER, how, str(alarm_s)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) == status, done.stderr[-3000:]
