"""The kernel the runner executes chapters in: ipykernel, started as ``python -m
ipykernel_launcher`` starts it, then, before it answers, the libraries every chapter imports
loaded with the garbage collector off and their objects frozen out of its passes
(:func:`gc.freeze`).

Why: a chapter's kernel spent about 4 s before and after its own work at the quick profile:
2.3 s on the imports of its first cell, collections during the chapter that walked the
imported libraries' 300,000 objects again (0.14 s each), and 1.1 s to shut down, most of it
the collections of the interpreter's exit (``benchmarks/kernel_start.py`` measures each).
The libraries are the ones the chapter imports itself (numpy first, as it does), after
the kernel has set itself up as usual (its ports, its output streams, the inline backend,
the warnings filters, ``sys.path``), so a chapter sees what it sees in a plain kernel
(``tests/test_kernel.py`` compares the two). Not loaded: ``matplotlib.pyplot`` and seaborn,
which pick the backend the chapter selects.

What differs: a library that fails to load here is left to the chapter, whose own import
then fails in its cell (a crash of a native library as it loads, or an exit, now stops the
kernel before it answers: the runner starts it again, then reports it); a warning a library
prints as it loads goes to no cell; and the frozen objects are never collected, nor finalized at exit, and
:func:`gc.get_objects` does not list them (the garbage among them is collected first).

``python -m attention_dynamics.book.kernel --preload numpy,pandas,... -f CONNECTION_FILE
[ipykernel options]``, the libraries a subset of :data:`PRELOADED` (those the chapter
imports: :func:`attention_dynamics.book.execution.preloaded_for`); the runner starts it
through :class:`attention_dynamics.book.execution.ChapterKernelManager`.
Only the standard library is imported before ipykernel's own start, as in its launcher.

**A template of kernels.** ``python -m attention_dynamics.book.kernel --template FD --preload
...`` loads the same libraries once, without starting a kernel, and then forks one kernel per
request that arrives on the Unix socket FD (:mod:`attention_dynamics.book.templates`, the
runner's side, sends them), so that the chapters after a worker's first start in a fraction
of a second instead of two. A forked kernel is what the kernel above would be: it takes the
request's environment, working folder, arguments and standard streams, and what its
libraries would have seen had they loaded after ipykernel set itself up is put as it would
be: the environment ipykernel sets (the inline backend where nothing set ``MPLBACKEND``,
the shell's ``TERM``, ``PAGER``...), a ``get_ipython`` whose shell has a kernel, output
streams with OutStream's encoding that are no terminal, the warnings filters the libraries
add in front of ipykernel's, and the logging handlers they make writing to ipykernel's
streams. numpy's global random state, PyTorch's default generator and multiprocessing's key
are drawn afresh, as a fresh import draws them. The template forks twice and the middle
process exits, so that the kernel becomes a child of the runner's process (a Linux "child
subreaper", set by the runner), which starts, signals, waits for and reads the exit status
of it as of any kernel it starts.
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
from pathlib import Path

__all__ = ["ACK", "PRELOADED", "KERNEL_MODULE", "PRELOAD_FLAG", "TEMPLATE_FLAG", "carry_into_session",
           "carry_into_session_soon", "main", "message_head", "read_message", "usable_cpus"]

KERNEL_MODULE = "attention_dynamics.book.kernel"
PRELOAD_FLAG = "--preload"
TEMPLATE_FLAG = "--template"

# numpy first, as in every chapter, and scipy.stats (through seaborn) after torch, as in every
# chapter that imports torch itself; where a chapter imports matplotlib and seaborn before the
# library brings in torch, torch loads after them there, which changes nothing a chapter
# sees: the only lasting warnings filters any of them adds are numpy's and scipy's.
PRELOADED = ("numpy", "pandas", "torch", "matplotlib", "scipy.stats")

# ipykernel's own default backend (IPKernelApp.init_gui_pylab), which a library loaded after
# its start reads from MPLBACKEND
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
# how long a forked kernel waits to become the runner's child (its middle parent exits at once)
ADOPTION_WAIT_S = 30.0
ACK = b"A"  # the runner's answer to a kernel's pid: it manages that kernel now


def _take_option(flag: str) -> str | None:
    """The value after ``flag`` in sys.argv, both taken out; None where the flag is absent."""
    i = sys.argv.index(flag) if flag in sys.argv else None
    if any(a.startswith(flag + "=") for a in sys.argv) or (i is not None and i + 1 >= len(sys.argv)):
        raise SystemExit(f"{flag} takes its value as the next argument")
    if i is None:
        return None
    value = sys.argv[i + 1]
    del sys.argv[i:i + 2]
    return value


def _preload_names() -> list[str]:
    try:
        value = _take_option(PRELOAD_FLAG)
    except SystemExit:
        raise SystemExit(f"{PRELOAD_FLAG} takes the libraries as the next argument, comma-separated") from None
    names = value.split(",") if value is not None else []
    unknown = sorted(set(names) - set(PRELOADED))
    if unknown:
        raise SystemExit(f"{PRELOAD_FLAG}: {', '.join(map(repr, unknown))} not among the libraries it loads "
                         f"({', '.join(PRELOADED)})")
    return names


def _as_launcher() -> None:
    """sys.argv[0] and sys.path as ipykernel_launcher has them, whose path the kernel's
    sys.argv shows: the working folder leaves sys.path while the kernel loads and the shell
    puts it back (InteractiveShellApp.init_path)."""
    sys.argv[0] = importlib.util.find_spec("ipykernel_launcher").origin
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]


def _load(names: list[str]) -> None:
    gc.disable()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # left to the chapter's own import, which reports it in its cell
            pass
    gc.enable()
    gc.collect()
    gc.freeze()  # what is loaded now lives as long as the kernel: no collection need walk it again


def main() -> None:
    names = _preload_names()
    template = _take_option(TEMPLATE_FLAG)
    _as_launcher()
    if template is not None:
        request = _serve(int(template), names)
        if request is None:  # the runner's process closed the socket: no more kernels
            return
        _become_kernel(*request)
        return
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize()  # binds the ports jupyter_client chose before the slow part below
    with app.shell.builtin_trap:  # get_ipython defined, as in a cell (pandas reads it as it loads)
        _load(names)
    app.start()


# --- the template -------------------------------------------------------------------------

def _serve(fd: int, names: list[str]):
    """Load the libraries as a kernel that had started would, then fork a kernel per
    request: returns, in the forked kernel only, (request, its standard streams, the warnings
    filters to restore, those to put in front, the logging handlers to point at ipykernel's
    streams); in the template, None when the socket closes or a kernel is not taken."""
    import builtins
    import os
    import signal
    import socket
    import warnings

    import ipykernel.kernelapp  # noqa: F401  everything a kernel imports before its libraries

    from ipykernel.zmqshell import ZMQInteractiveShell

    sock = socket.socket(fileno=fd)
    # the state the libraries would have loaded in: the environment ipykernel had set (the
    # inline backend where nothing set MPLBACKEND, the shell's TERM, PAGER...), the working
    # folder first on sys.path (the shell's ''), the filters ipykernel had then
    environ = dict(os.environ)
    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = INLINE_BACKEND
    ZMQInteractiveShell.init_environment(None)  # it sets os.environ only
    sys.path.insert(0, "")
    before = list(warnings.filters)
    had_handlers = set(_stream_handlers())
    # as in a cell, get_ipython is defined: pandas asks it whether it runs in a kernel (a shell
    # with a kernel) as it loads, and shows 20 columns there, as many as fit in a terminal
    builtins.get_ipython = lambda: _ShellAsLoadingSeesIt()
    # and the output streams are ipykernel's as far as a library can tell as it loads (pandas
    # takes its display encoding from them)
    streams = {name: _StreamAsLoadingSeesIt(getattr(sys, name)) for name in ("stdout", "stderr")}
    sys.stdout, sys.stderr = streams["stdout"], streams["stderr"]
    try:
        _load(names)
    finally:
        del builtins.get_ipython
        sys.stdout, sys.stderr = streams["stdout"].stream, streams["stderr"].stream
    del sys.path[0]
    # the logging handlers the libraries made as they loaded (PyTorch makes some) write to the
    # streams of that moment: in a kernel, ipykernel's, which a forked kernel gives them
    rebind = [(h, name) for h in _stream_handlers() if h not in had_handlers
              for name in ("stdout", "stderr") if h.stream is streams[name]]
    os.environ.clear()
    os.environ.update(environ)
    after = list(warnings.filters)
    added = len(after) - len(before)
    if added < 0 or after[added:] != before:
        # a library removed or appended a filter: a forked kernel could not place it as a kernel
        # that loaded the library itself would; the runner starts such kernels the plain way
        raise SystemExit("kernel template: the libraries changed the warnings filters other than by adding "
                         "in front; not serving")
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        got = _receive(sock)
        if got is None:
            return None
        request, streams = got
        kernel = None
        try:
            kernel = _fork_kernel(sock)
        except OSError as e:
            try:
                _reply(sock, {"id": request["id"], "error": f"fork failed: {e}"})
            except OSError:
                return None
        finally:
            if kernel != 0:
                for s in streams:
                    os.close(s)
        if kernel == 0:
            return request, streams, before, after[:added], rebind
        if kernel is not None:
            # the runner acknowledges the pid it now manages; without that (it gave up waiting,
            # it was interrupted, it died) no one would manage this kernel
            try:
                _reply(sock, {"id": request["id"], "pid": kernel})
                took = sock.recv(1) == ACK
            except OSError:
                took = False
            if not took:
                os.kill(kernel, signal.SIGKILL)
                return None


def _fork_kernel(sock) -> int:
    """Fork twice: 0 in the kernel, its pid in the template. The middle process exits at once,
    so that the kernel is adopted by the runner's process, a child subreaper."""
    import os

    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            kernel = os.fork()
            if kernel == 0:
                os.close(r)
                os.close(w)
                sock.close()
                return 0
            os.write(w, str(kernel).encode())
        except BaseException:
            pass
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        said = pipe.read()
    os.waitpid(middle, 0)
    if not said:
        raise OSError("the middle process could not fork the kernel")
    return int(said)


class _ShellAsLoadingSeesIt:
    """What a library loading in the template gets from get_ipython: the one thing the
    preloaded libraries ask of it as they load is whether the shell has a kernel."""
    kernel = None


class _StreamAsLoadingSeesIt:
    """The template's own stream, with the encoding and the answer to isatty() of ipykernel's
    OutStream, which a kernel's libraries see as they load."""

    def __init__(self, stream):
        from ipykernel.iostream import OutStream

        self.stream = stream
        self.encoding = OutStream.encoding

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _stream_handlers() -> list:
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers
            if isinstance(h, logging.StreamHandler)]


def _become_kernel(request: dict, streams: list[int], filters: list, libraries_filters: list, rebind: list) -> None:
    """In the forked kernel: its own session, streams, parent, environment, folder and
    arguments, then ipykernel's start as in :func:`main`, the libraries already loaded."""
    import os
    import time
    import warnings

    os.setsid()  # as jupyter_client starts a kernel: its own process group, which it signals
    for i, s in enumerate(streams):
        os.dup2(s, i)
        os.close(s)
    carry_into_session(0, "a chapter's kernel")  # here, not in a thread: nothing of it runs yet; its note on its own stderr
    deadline = time.monotonic() + ADOPTION_WAIT_S
    while os.getppid() != request["parent"]:  # ipykernel's parent poller compares the two
        if time.monotonic() > deadline:
            print(f"kernel template: the kernel was not adopted by process {request['parent']}", file=sys.stderr)
            os._exit(1)
        time.sleep(0.0005)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv[1:] = request["argv"]
    # drawn afresh as they load in a kernel of its own (the string hash seed cannot be: where
    # PYTHONHASHSEED is unset, a template's kernels share its own; the runner sets it to 0)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)
    warnings.filters[:] = filters
    warnings._filters_mutated()
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize()
    for f in reversed(libraries_filters):  # as warnings.filterwarnings adds each: in front, once
        if f in warnings.filters:
            warnings.filters.remove(f)
        warnings.filters.insert(0, f)
    warnings._filters_mutated()
    for handler, name in rebind:
        handler.setStream(getattr(sys, name))
    app.start()


# --- niceness across sessions --------------------------------------------------------------
# Where Linux groups the CPU by session (kernel.sched_autogroup_enabled, on by default on many
# distributions), the scheduler shares the CPUs among *autogroups*, one per session, and applies
# niceness only within each. A process that starts a session of its own (setsid: jupyter_client
# starts every kernel so, and the templates and their kernels do likewise) gets a new autogroup
# at nice 0 whatever its own niceness, so a book run at a lower priority (nice, or the test
# session's quick book beside the tests) would have its kernels compete at full weight. Here,
# not in a module of its own: a forked kernel calls it, and must hold no module a plain kernel
# does not (tests/test_kernel.py).

AUTOGROUP = Path("/proc/self/autogroup")
# Linux refuses an autogroup change within 100 ms of the last one anywhere on the system
# (EAGAIN) to a process without CAP_SYS_ADMIN, so kernels starting side by side queue for it:
# about one change per 100 ms. Those that may start at once here are a kernel and a template
# per worker, a worker per usable CPU; the patience covers all of them and a few more, twice
# over (past it the kernel runs at its autogroup's weight, as it did before, and says so).
_AUTOGROUP_RETRIES, _AUTOGROUP_RETRY_WAIT_S = 5, 0.11


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; all of them off Linux). Here, where a
    forked kernel can reach it without the scheduling module; attention_dynamics.book.scheduling
    exports it."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _autogroup_patience_s() -> float:
    """How long Linux's throttle is waited out: the changes that may queue at once, 100 ms
    apart at best, twice over, since a waiter whose tries fall just after others' changes can
    lose round after round; the waits between tries are drawn at random so that no waiter
    keeps the losing phase."""
    return 2 * (_AUTOGROUP_RETRIES + 2 * usable_cpus()) * _AUTOGROUP_RETRY_WAIT_S


def _open_autogroup(pid: int) -> int | None:
    """A descriptor to write the autogroup of process ``pid`` (0: this one), None where there
    is none. Held across the retries: it stays the process's, so a write after the process
    has ended answers ESRCH instead of reaching another process given the same pid."""
    import os

    path = AUTOGROUP if pid == 0 else Path(f"/proc/{pid}/autogroup")
    try:
        return os.open(path, os.O_WRONLY)
    except OSError:  # not Linux, no autogroups, or the process has ended
        return None


def _write_autogroup(fd: int, text: str) -> None:
    import os

    os.write(fd, text.encode())


def _now() -> float:
    import time

    return time.monotonic()


def _wait(seconds: float) -> None:
    import time

    time.sleep(seconds)


def carry_into_session(pid: int = 0, role: str = "this process") -> bool:
    """Give the autogroup of process ``pid`` (0: this one; ``role``: what it is, for the
    note) that process's niceness; whether it was written. Call it right after the process
    has started a session (its autogroup is then its own): in the process itself, or in its
    parent once :class:`subprocess.Popen` with ``start_new_session`` has returned
    (:func:`carry_into_session_soon`, not to wait there). Nothing is written for a process that
    does not lead its session (the autogroup is its session's, shared with the processes that
    started it), at niceness 0 or below (a new autogroup is at 0; below needs a privilege), nor
    where the system has no autogroups (not Linux, or a kernel without them): there niceness
    applies across sessions already. Linux's throttle is waited out for
    :func:`_autogroup_patience_s`; past it, a note on stderr."""
    import errno
    import os
    import random
    import sys

    fd = _open_autogroup(pid)  # first: os.getsid and os.getpriority are missing on Windows
    if fd is None:
        return False
    try:
        try:
            n, leads = os.getpriority(os.PRIO_PROCESS, pid), os.getsid(pid) == (pid or os.getpid())
        except OSError:  # it has ended
            return False
        if n <= 0 or not leads:
            return False
        patience = _autogroup_patience_s()
        deadline, tries = _now() + patience, 0
        jitter = random.Random()  # not the random module's own generator, which a kernel's cells may seed
        while True:
            tries += 1
            try:
                _write_autogroup(fd, str(n))
                return True
            except OSError as e:
                if e.errno != errno.EAGAIN:
                    return False  # a scheduling hint: the kernel runs as it would have without it
            if _now() >= deadline:
                break
            _wait(jitter.uniform(0.5, 1.5) * _AUTOGROUP_RETRY_WAIT_S)
    finally:
        os.close(fd)
    print(f"note: {role} (pid {pid or os.getpid()}) runs at nice {n} in a session whose CPU share stays at "
          f"nice 0: Linux refused {tries} changes of its autogroup over {patience:.1f} s (EAGAIN: too many "
          "processes started sessions at once)", file=sys.stderr)
    return False


def carry_into_session_soon(pid: int, role: str, then=None):
    """:func:`carry_into_session` for another process, in a thread of this one, so that its
    waits on Linux's throttle do not hold up the caller (a runner starting its kernels);
    ``then`` (no arguments) is called in the thread once the carry is over, however it ended,
    or at once in the caller's thread where no thread can start (then there is no carry).
    Returns the thread (a daemon: the change is a hint, not worth a wait at exit), or None
    where it could not start."""
    import threading

    def carry():
        try:
            carry_into_session(pid, role)
        finally:
            if then is not None:
                then()

    thread = threading.Thread(target=carry, name=f"carry-nice-{pid}", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no thread to be had: no carry, and a caller waiting for then goes on
        if then is not None:
            then()
        return None
    return thread


# --- the socket: a message is its length in 8 digits, then JSON; a request carries the ------
# --- kernel's three standard streams on its length ---------------------------------------

def message_head(body: bytes) -> bytes:
    return b"%08d" % len(body)


def read_message(sock, head: bytes = b"") -> dict | None:
    """The next message whole (``head``: what of it was read already), None at the end."""
    import json

    def exactly(n: int, got: bytes) -> bytes | None:
        while len(got) < n:
            more = sock.recv(n - len(got))
            if not more:
                return None
            got += more
        return got

    head = exactly(8, head)
    body = None if head is None else exactly(int(head), b"")
    return None if body is None else json.loads(body)


def _receive(sock):
    import socket

    head, fds, _, _ = socket.recv_fds(sock, 8, 3)
    request = read_message(sock, head) if head else None
    return None if request is None else (request, list(fds))


def _reply(sock, message: dict) -> None:
    import json

    body = json.dumps(message).encode()
    sock.sendall(message_head(body) + body)


if __name__ == "__main__":
    main()
