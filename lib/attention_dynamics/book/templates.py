"""Kernels forked from a template process that has the chapters' libraries loaded already
(:mod:`attention_dynamics.book.kernel` with ``--template``): the runner's side.

Why: the runner's kernel spends about 2 s of its start loading numpy, pandas, PyTorch,
matplotlib and scipy.stats, in every chapter; a worker runs many chapters one after another,
and forking a process that has loaded them once takes a small part of that
(``benchmarks/kernel_start.py`` measures both).

How the runner keeps managing the kernel as its own: this process becomes a Linux *child
subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), and the template forks each kernel through a
middle process that exits at once, so the kernel is adopted by this process. It is then this
process's child, as a kernel jupyter_client starts is: :class:`ForkedKernel` polls, signals,
waits for it and reads its exit status as :class:`subprocess.Popen` does, and ipykernel's
own check that its parent lives (``JPY_PARENT_PID``) holds. A side effect: any other orphan
among this process's descendants is adopted too and stays a zombie until this process exits.

A template serves one environment and working folder (what the libraries read as they load:
``OMP_NUM_THREADS``, ``MPLBACKEND``, a ``matplotlibrc`` in the folder, ipykernel the
``JPY_PARENT_PID`` by which a kernel ends when its parent does...), the kernel's own
other ``JPY_*`` variables apart; a kernel of another is forked from a template of its own, and at
most :data:`MAX_TEMPLATES` are kept per process. Where no template can serve (not Linux, the
subreaper refused, the template failed), the kernel starts the plain way, with a note.
``ATTENTION_DYNAMICS_KERNEL_TEMPLATE=0`` turns templates off.

What a template cannot give its kernels as a fresh start would: it is a snapshot of the
libraries and the files they read as they loaded (a library upgraded, or a ``matplotlibrc``
edited, while a worker lives reaches its kernels only from its next template; the worker
itself keeps what it loaded too), and of the process attributes of its start (umask, limits,
CPU affinity, niceness); where ``PYTHONHASHSEED`` is unset, its kernels share one string hash
seed (``make.py`` sets it to 0 for every build and test); the libraries' exit handlers run
after ipykernel's instead of before; and each worker holds up to two idle templates in
memory (the loaded libraries, shared with its kernels until written).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from jupyter_client.provisioning import LocalProvisioner

from .kernel import ACK, KERNEL_MODULE, PRELOAD_FLAG, TEMPLATE_FLAG, carry_into_session_soon, message_head, read_message

__all__ = ["ChapterProvisioner", "ForkedKernel", "KernelTemplate", "MAX_TEMPLATES", "fork_kernel", "templates_enabled"]

MAX_TEMPLATES = 2
SWITCH = "ATTENTION_DYNAMICS_KERNEL_TEMPLATE"
# a template loads its libraries (about 2 s) before it answers its first request; the
# kernel's own start has KERNEL_START_TIMEOUT_S beyond that
REPLY_TIMEOUT_S = 300
PR_SET_CHILD_SUBREAPER = 36


class TemplateFailed(RuntimeError):
    def __init__(self, message: str, noted: bool = False):
        super().__init__(message)
        self.noted = noted  # said already, when the template first failed


def templates_enabled() -> bool:
    value = os.environ.get(SWITCH, "1")
    if value not in {"0", "1"}:
        raise ValueError(f"{SWITCH} must be '0' or '1', got {value!r}")
    return value == "1" and sys.platform.startswith("linux")


_subreaper_of: int | None = None  # the pid of the process that made itself a subreaper


_refused_in: int | None = None


def _make_subreaper() -> None:
    """This process adopts its orphaned descendants (not inherited by a fork: checked by pid);
    TemplateFailed where it cannot, said once."""
    global _subreaper_of, _refused_in
    if _subreaper_of == os.getpid():
        return
    if _refused_in == os.getpid():
        raise TemplateFailed("this process could not become a child subreaper", noted=True)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _refused_in = os.getpid()
        raise TemplateFailed(f"this process could not become a child subreaper ({os.strerror(ctypes.get_errno())})")
    _subreaper_of = os.getpid()


class KernelTemplate:
    """One template process: started with the environment and working folder of the kernels
    it forks, their JPY_* variables apart."""

    module = KERNEL_MODULE

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], cwd: str):
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            raise TemplateFailed(f"the kernel template could not start: {e}") from None
        cmd = [sys.executable, "-m", self.module, TEMPLATE_FLAG, str(theirs.fileno()),
               PRELOAD_FLAG, ",".join(preload)]
        try:
            # a session of its own, as a kernel's: a Ctrl-C at the terminal reaches the runner,
            # which stops its kernels, not the template; it exits when this process's end closes
            self.process = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                            pass_fds=[theirs.fileno()], start_new_session=True)
        except OSError as e:
            ours.close()
            raise TemplateFailed(f"the kernel template could not start: {e}") from None
        finally:
            theirs.close()
        carry_into_session_soon(self.process.pid, "a kernel template")
        self.socket = ours
        self.socket.settimeout(REPLY_TIMEOUT_S)
        self.lock = threading.Lock()
        self.requests = 0
        self.users = 0  # threads between taking it from the registry and their reply: not evicted

    def fork_kernel(self, argv: list[str], env: dict[str, str], cwd: str) -> int:
        """The pid of a kernel forked with these arguments (after ``-m``'s module and its
        options), environment and folder, its standard streams this process's (its stdin an
        empty pipe, as jupyter_client gives a kernel); it is this process's child. A request
        not answered (an error, the timeout, an interruption) closes the template, which kills
        a kernel it forked for it whose pid this process did not acknowledge (and a reply read
        later could belong to another request)."""
        r, w = os.pipe()
        os.close(w)
        try:
            with self.lock:
                self.requests += 1
                request = json.dumps({"id": self.requests, "argv": argv, "env": env, "cwd": cwd,
                                      "parent": os.getpid()}).encode()
                # the fds ride on the length alone, which always fits; the rest may take many sends
                socket.send_fds(self.socket, [message_head(request)], [r, 1, 2])
                self.socket.sendall(request)
                reply = read_message(self.socket)
                if reply is None:
                    raise OSError("it closed its socket")
                if reply.get("id") != self.requests:
                    raise ValueError(f"the reply answers request {reply.get('id')}, not {self.requests}")
                if "pid" in reply:
                    try:
                        self.socket.sendall(ACK)
                    except BaseException:  # the ACK may have gone: the kernel is this process's to end
                        _end(reply["pid"])
                        raise
        except (OSError, ValueError) as e:
            self.close()
            code = self.process.returncode
            how = f"it exited with status {code}" if code is not None and code > 0 else str(e)
            raise TemplateFailed(f"the kernel template (pid {self.process.pid}) did not answer: {how}") from None
        except BaseException:
            self.close()
            raise
        finally:
            os.close(r)
        if "pid" not in reply:
            raise TemplateFailed(f"the kernel template could not fork a kernel: {reply.get('error')}")
        return reply["pid"]

    def alive(self) -> bool:
        return self.process.poll() is None and self.socket.fileno() >= 0

    def close(self) -> None:
        """The template exits when its socket closes; one that does not is killed."""
        if self.socket.fileno() >= 0:
            self.socket.close()
        if self.process.returncode is not None:
            return
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_templates: dict[tuple, KernelTemplate] = {}  # least recently used first
_failed: set[tuple] = set()  # those that failed once: their kernels start the plain way
_templates_lock = threading.Lock()


def _forget_in_child() -> None:
    """A forked child of this process (a pool's worker) must not share the templates' sockets:
    its own kernels come from templates of its own."""
    global _templates_lock
    _templates_lock = threading.Lock()  # another thread may have held it at the fork
    inherited = list(_templates.values())
    _templates.clear()
    for t in inherited:
        t.socket.close()


os.register_at_fork(after_in_child=_forget_in_child)


def fork_kernel(preload: tuple[str, ...], argv: list[str], env: dict[str, str], cwd: str) -> int:
    """A kernel forked from the template of this environment and folder (started at its
    first kernel): its pid, a child of this process. Raises TemplateFailed where none can
    serve; a template that failed once is not started again."""
    _make_subreaper()
    _reap_dropped()
    # JPY_PARENT_PID, this process's pid, is the same for all its kernels, and ipykernel reads
    # it as it loads (IPKernelApp.parent_handle's default); the other JPY_* are each kernel's
    own = {k: v for k, v in env.items() if not k.startswith("JPY_") or k == "JPY_PARENT_PID"}
    key = (preload, cwd, tuple(sorted(own.items())))
    closing = []
    with _templates_lock:
        if key in _failed:
            raise TemplateFailed("the kernel template failed before", noted=True)
        t = _templates.pop(key, None)
        if t is None or not t.alive():
            if t is not None:
                closing.append(t)
            # the least recently used first, none that another thread is using
            idle = [k for k, other in _templates.items() if other.users == 0]
            closing += [_templates.pop(k) for k in idle[:max(0, len(_templates) - MAX_TEMPLATES + 1)]]
            try:
                t = KernelTemplate(preload, own, cwd)
            except TemplateFailed:
                _failed.add(key)
                raise
        _templates[key] = t
        t.users += 1
    for old in closing:  # outside the lock: a close may wait for its template to exit
        old.close()
    try:
        return t.fork_kernel(argv, env, cwd)
    except TemplateFailed:
        with _templates_lock:
            _failed.add(key)
            if _templates.get(key) is t:
                del _templates[key]
        t.close()
        raise
    finally:
        with _templates_lock:
            t.users -= 1


_dropped: list[int] = []  # kernels whose ForkedKernel went away before reaping them


def _reap_dropped() -> None:
    with _templates_lock:
        for pid in list(_dropped):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                _dropped.remove(pid)


def _end(pid: int) -> None:
    """Kill a kernel this process will not manage, and reap it later."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _dropped.append(pid)


class ForkedKernel:
    """A kernel forked from a template and adopted by this process, with the parts of
    :class:`subprocess.Popen` that jupyter_client's :class:`LocalProvisioner` uses; as
    Popen's, one dropped while its kernel runs is reaped later (at the next fork)."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def __del__(self):
        try:
            if self.returncode is None and self.poll() is None:
                _dropped.append(self.pid)
        except Exception:  # at the interpreter's exit, the modules may be gone
            pass

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): as Popen, status 0
                self.returncode = 0
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ChapterProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, forking the runner's kernel from a template where
    one can serve (the command is the runner's kernel in this interpreter), else starting it
    as it does."""

    async def launch_kernel(self, cmd: list[str], **kwargs):
        head = [sys.executable, "-m", KERNEL_MODULE, PRELOAD_FLAG]
        if cmd[:4] != head or not templates_enabled():
            return await self._launch_plain(cmd, **kwargs)
        preload = tuple(cmd[4].split(","))
        env = dict(kwargs.get("env") or os.environ)
        env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launch_kernel sets it
        cwd = str(kwargs.get("cwd") or os.getcwd())
        try:
            pid = fork_kernel(preload, cmd[5:], env, cwd)
        except TemplateFailed as e:
            if not e.noted:
                print(f"note: {e}; starting kernels of this environment the plain way", file=sys.stderr, flush=True)
            return await self._launch_plain(cmd, **kwargs)
        self.process = ForkedKernel(pid)
        self.pid = self.pgid = pid  # the kernel leads a session of its own
        self.cwd = cwd
        return self.connection_info

    async def _launch_plain(self, cmd: list[str], **kwargs):
        """jupyter_client's start, then the runner's niceness carried into the kernel's session
        (it started one of its own) before the kernel is handed back, so that its first cell
        runs at the runner's share. The carry waits in a thread of its own, which wakes the
        loop when it is over; not ``asyncio.to_thread``: in a pool's worker forked from a
        runner whose loop had used its default executor, the inherited executor counts an idle
        thread the fork did not copy, and a call to it waits for ever (the workers now start
        with a fresh loop, ``scheduling._fresh_event_loop``; ``tests/test_templates.py``
        reproduces the hazard)."""
        info = await super().launch_kernel(cmd, **kwargs)
        loop = asyncio.get_running_loop()
        carried = loop.create_future()

        def wake():
            try:
                loop.call_soon_threadsafe(lambda: carried.done() or carried.set_result(None))
            except RuntimeError:  # the loop has closed (the launch was abandoned)
                pass

        carry_into_session_soon(self.pid, "a chapter's kernel", then=wake)
        await carried
        return info
