"""The runner's kernel (attention_dynamics.book.kernel): a chapter sees what it sees in
jupyter_client's plain kernel (its paths and arguments, its environment, its warnings
filters, matplotlib's backend and settings, its threads, its signal handler) and computes the
same numbers and the same figure, except that the libraries every chapter imports are loaded
already and frozen out of the collector's passes."""
from __future__ import annotations

import sys

from jupyter_client.kernelspec import KernelSpec

from attention_dynamics.book import execution
from attention_dynamics.book.execution import kernel_manager, preloaded_for
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.kernel import PRELOADED
from attention_dynamics.book.templates import SWITCH
from support import TINY_CELLS, make_root

PROBE_CELLS = [
    TINY_CELLS[0],
    ("code", f"SWITCH = {SWITCH!r}  # which kernel ran: set by the test", []),
    # before the chapter imports anything: what the kernel had loaded and frozen
    ("code", "import gc, sys\nfrozen = gc.get_freeze_count()\n"
             f"loaded = sorted(m for m in {PRELOADED!r} if m in sys.modules)", []),
    # a chapter's imports, in a chapter's order
    ("code", "import hashlib, io, os, signal, warnings\nimport numpy as np\nimport pandas as pd\nimport torch\n"
             "import matplotlib\nimport matplotlib.pyplot as plt\nimport seaborn as sns\nimport scipy.stats\n"
             "from attention_dynamics.book.records import Record\nrec = Record(record_path)", []),
    ("code", "rec['frozen'], rec['loaded'] = frozen, loaded\n"
             # forked from a template (book.templates), and adopted: the runner's process its parent
             "rec['forked'] = '--template' in sys.orig_argv\n"
             "rec['parent'] = os.getppid() == int(os.environ['JPY_PARENT_PID'])\n"
             "rec['stdin'] = __import__('stat').S_ISFIFO(os.fstat(0).st_mode) and os.read(0, 1) == b''\n"
             # ipykernel's settings, some read from the environment as it loads (its parent's pid,
             # by which it ends with its parent), each kernel's ports and connection file apart
             "from ipykernel.kernelapp import IPKernelApp\napp = IPKernelApp.instance()\n"
             "rec['poller'] = type(app.poller).__name__\n"
             "shown = {k: repr(v).replace(app.connection_file, 'CONNECTION') for k, v in app.trait_values().items()}\n"
             "rec['app'] = {k: v for k, v in shown.items() if not k.endswith(('port', 'ports'))\n"
             # (flags: the --secure flag's key, drawn as jupyter_client loads, in every kernel its own)
             "              and k not in ('parent_handle', 'flags') and not v.startswith('<') and ' at 0x' not in v}\n"
             "rec['app']['parent_handle'] = app.parent_handle == int(os.environ['JPY_PARENT_PID'])\n"
             "rec['poller_parent'] = app.poller.parent_pid == int(os.environ['JPY_PARENT_PID'])\n"
             # every pandas option: some are chosen as pandas loads, by asking get_ipython
             "rec['pandas'] = {k: repr(pd.get_option(k)) for k in pd._config.config._registered_options}\n"
             # the streams what loaded before the first cell writes to: a library's logging
             # handlers, the hooks, each as its type
             "import logging\nloggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]\n"
             "rec['handlers'] = sorted(f'{lg.name}:{type(h).__name__}:{type(getattr(h, \"stream\", None)).__name__}'\n"
             "                         for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers)\n"
             "rec['hooks'] = [type(h).__name__ for h in (sys.stdout, sys.stderr, sys.displayhook, sys.excepthook,\n"
             "                                           warnings.showwarning)]\n"
             # each kernel its own: the connection file, the parent's pid and session name
             "rec['argv'] = [a if a != sys.argv[sys.argv.index('-f') + 1] else 'CONNECTION' for a in sys.argv]\n"
             "rec['path'], rec['cwd'] = sys.path, os.getcwd()\n"
             "rec['environ'] = {k: v for k, v in os.environ.items() if not k.startswith('JPY_') and k != SWITCH}\n"
             "rec['warnings'] = [repr(f) for f in warnings.filters]\n"
             "rec['backend'], rec['rc'] = matplotlib.get_backend(), {k: repr(v) for k, v in matplotlib.rcParams.items()}\n"
             "rec['threads'] = [torch.get_num_threads(), torch.get_num_interop_threads()]\n"
             "rec['sigint'] = repr(signal.getsignal(signal.SIGINT))\n"
             # drawn afresh as they load in every process (below: they differ between any two)
             "import multiprocessing\nrec['fresh'] = [np.random.random(), torch.rand(1).item(),\n"
             "                bytes(multiprocessing.current_process().authkey).hex()]\n"
             "torch.manual_seed(0)\na = torch.randn(256, 256)\n"
             "rec['torch'] = (a @ a).sum().item()\n"
             "x = np.random.default_rng(0).normal(size=(256, 256))\n"
             "rec['numpy'] = float((x @ x).sum())\n"
             "rec['scipy'] = float(scipy.stats.norm.ppf(np.linspace(0.01, 0.99, 99)).sum())\n"
             "fig, ax = plt.subplots()\nax.plot(np.sin(np.linspace(0, 6, 50)))\nbuf = io.BytesIO()\n"
             "fig.savefig(buf, format='png')\nrec['png'] = hashlib.sha256(buf.getvalue()).hexdigest()\n"
             "rec['modules'] = sorted(sys.modules)\n"  # nothing loaded that the plain kernel does not load
             "rec.save()", []),
]


def _probe(root, monkeypatch, kernel: str) -> dict:
    """The probe's record, run through the runner: ``plain``, with nothing to preload, which
    starts jupyter_client's plain kernel; ``runner's``, the runner's kernel started as a
    process of its own (templates off); ``forked``, forked from a template."""
    with monkeypatch.context() as m:
        if kernel == "plain":
            m.setattr(execution, "preloaded_for", lambda notebook: ())
        m.setenv(SWITCH, "0" if kernel == "runner's" else "1")
        out = root / f"{kernel.strip(chr(39) + 's')}-{len(list(root.glob('*-*')))}"
        (job,) = make_jobs(root, "quick", out_dir=out)
        return execution.execute(job).record["values"]


def test_a_chapter_sees_the_plain_kernels_world_with_the_libraries_loaded_and_frozen(tmp_path, monkeypatch):
    """Positive control: the runner's kernel has the libraries loaded and frozen; negative: the
    plain kernel has neither, so the probe can tell the two apart. Everything else the chapter
    can see or compute is the same: the inline backend where nothing set MPLBACKEND (ipykernel
    sets it as it starts, before the runner's kernel loads matplotlib), and one thread where
    the runner's worker sets OMP_NUM_THREADS=1 (on two CPUs PyTorch would take two)."""
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root = make_root(tmp_path, PROBE_CELLS, name="probe")
    plain = _probe(root, monkeypatch, "plain")
    runners = _probe(root, monkeypatch, "runner's")
    # the first kernel of a template, and one from a template that has served before
    forked = [_probe(root, monkeypatch, "forked") for _ in range(2)]
    for r in [runners, *forked]:
        assert r["frozen"] > 100_000 and r["loaded"] == sorted(PRELOADED)
    assert plain["frozen"] == 0 and len(plain["loaded"]) < len(PRELOADED), plain["loaded"]
    assert [r["forked"] for r in (plain, runners, *forked)] == [False, False, True, True]
    for r in [runners, *forked]:
        assert r["backend"] == plain["backend"] == "module://matplotlib_inline.backend_inline"
        assert r["threads"][0] == plain["threads"][0] == 1
    fresh = [r.pop("fresh") for r in (plain, runners, *forked)]
    for values in zip(*fresh):
        assert len(set(values)) == len(values), fresh
    seen = set(plain) - {"frozen", "loaded", "forked"}
    assert {"argv", "environ", "warnings", "rc", "torch", "png", "modules", "parent", "stdin", "app", "handlers",
            "hooks", "pandas"} <= seen
    assert plain["pandas"]["display.max_columns"] == "20"  # as in a Jupyter kernel, not a terminal
    assert plain["parent"] and plain["stdin"] and plain["poller"] == "ParentPollerUnix" and plain["app"]["parent_handle"]
    assert plain["poller_parent"]
    for r in [runners, *forked]:
        assert {k: r[k] for k in seen if r[k] != plain[k]} == {}


def test_only_ipykernels_launcher_in_this_interpreter_is_replaced():
    """A kernel command of another interpreter (which may not have this library) or another
    kernel, or a notebook with nothing to preload, starts as its kernel spec says."""
    def command(argv, preload=PRELOADED):
        km = kernel_manager(preload)(kernel_name="python3")
        km._kernel_spec = KernelSpec(argv=argv, display_name="x", language="python")
        return km.format_kernel_cmd()

    tail = ["-f", "{connection_file}"]
    ours = [sys.executable, "-m", "ipykernel_launcher", *tail]
    assert command(ours, ("numpy", "torch"))[:5] == [
        sys.executable, "-m", "attention_dynamics.book.kernel", "--preload", "numpy,torch"]
    assert command(ours, ())[:3] == ours[:3]
    other = ["/opt/other/bin/python3", "-m", "ipykernel_launcher", *tail]
    assert command(other)[:3] == other[:3]
    assert command([sys.executable, "-m", "some_other_kernel", *tail])[:3] == [sys.executable, "-m", "some_other_kernel"]


def test_every_chapter_preloads_what_it_imports_and_a_notebook_without_them_nothing(root, tmp_path):
    """Every chapter imports all the preloaded libraries (through the library's plotting,
    seaborn and torch), so each starts with them loaded; the runner's tests' tiny notebooks
    import none and start in a plain kernel, which starts faster."""
    chapters = sorted((root / "notebooks").glob("*.ipynb"))
    assert chapters and {nb.stem: preloaded_for(nb) for nb in chapters} == {nb.stem: PRELOADED for nb in chapters}
    tiny = make_root(tmp_path, TINY_CELLS) / "notebooks" / "tiny.ipynb"
    assert preloaded_for(tiny) == ()
    (tmp_path / "probe").mkdir()
    probe = make_root(tmp_path / "probe", PROBE_CELLS, name="probe")
    assert preloaded_for(probe / "notebooks" / "probe.ipynb") == PRELOADED


def test_a_library_it_does_not_load_or_a_missing_list_is_named_before_the_kernel_starts():
    import subprocess

    def start(*args):
        done = subprocess.run([sys.executable, "-m", "attention_dynamics.book.kernel", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        return done.stderr

    assert "--preload: 'sklearn' not among the libraries it loads (numpy, pandas, torch" in start(
        "--preload", "numpy,sklearn", "-f", "unused.json")
    assert "--preload takes the libraries as the next argument" in start("-f", "unused.json", "--preload")
    assert "--preload takes the libraries as the next argument" in start("--preload=numpy", "-f", "unused.json")


def test_only_imports_that_run_count(tmp_path):
    """An import inside a function, which may never be called, loads nothing in a plain kernel
    and so none here: its notebook starts in the plain kernel."""
    cells = [TINY_CELLS[0], ("code", "def later():\n    import torch\n    import seaborn\nx = 1", [])]
    notebook = make_root(tmp_path, cells, name="later") / "notebooks" / "later.ipynb"
    assert preloaded_for(notebook) == ()
    # the library's own modules likewise: geometry imports scipy.stats only inside a function
    cells[1] = ("code", "import attention_dynamics.geometry", [])
    (tmp_path / "a").mkdir()
    notebook = make_root(tmp_path / "a", cells, name="geometry") / "notebooks" / "geometry.ipynb"
    assert preloaded_for(notebook) == ("numpy", "torch")
    cells[1] = ("code", "if True:\n    import torch\nfrom scipy import stats", [])
    (tmp_path / "b").mkdir()
    notebook = make_root(tmp_path / "b", cells, name="now")
    assert preloaded_for(notebook / "notebooks" / "now.ipynb") == ("torch", "scipy.stats")
