"""The runner's kernel (attention_dynamics.book.kernel): a chapter sees what it sees in
jupyter_client's plain kernel (its paths, its environment, its matplotlib backend, its
threads), except that the libraries every chapter imports are loaded already and frozen out
of the collector's passes."""
from __future__ import annotations

import sys

from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpec

from attention_dynamics.book import execution
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.kernel import PRELOADED, ChapterKernelManager
from support import TINY_CELLS, make_root

PROBE_CELLS = [
    TINY_CELLS[0],
    # before the chapter imports anything: what the kernel had loaded and frozen
    ("code", "import gc, sys\nfrozen = gc.get_freeze_count()\n"
             f"loaded = sorted(m for m in {PRELOADED!r} if m in sys.modules)", []),
    ("code", "import os\nimport matplotlib\nimport matplotlib.pyplot as plt\nimport torch\n"
             "from attention_dynamics.book.records import Record\nrec = Record(record_path)\n"
             "rec['frozen'], rec['loaded'] = frozen, loaded\n"
             "rec['backend'], rec['threads'] = matplotlib.get_backend(), torch.get_num_threads()\n"
             "rec['path'], rec['cwd'] = sys.path, os.getcwd()\n"
             # each kernel its own: the parent's pid and session name jupyter_client passes
             "rec['environ'] = {k: v for k, v in os.environ.items() if not k.startswith('JPY_')}\n"
             "rec.save()", []),
]


def _probe(root, manager, monkeypatch) -> dict:
    monkeypatch.setattr(execution, "ChapterKernelManager", manager)
    (job,) = make_jobs(root, "quick", out_dir=root / manager.__name__)
    return execution.execute(job).record["values"]


def test_a_chapter_sees_the_plain_kernels_world_with_the_libraries_loaded_and_frozen(tmp_path, monkeypatch):
    """Positive control: the runner's kernel has the libraries loaded and frozen; negative: the
    plain kernel has neither, so the probe can tell the two apart. Everything else the chapter
    can see is the same, the inline backend included where nothing set MPLBACKEND (ipykernel
    sets it as the kernel starts; the runner's kernel must set it before loading matplotlib)."""
    monkeypatch.delenv("MPLBACKEND", raising=False)
    root = make_root(tmp_path, PROBE_CELLS, name="probe")
    plain = _probe(root, AsyncKernelManager, monkeypatch)
    runners = _probe(root, ChapterKernelManager, monkeypatch)
    assert runners["frozen"] > 100_000 and runners["loaded"] == sorted(PRELOADED)
    assert plain["frozen"] == 0 and len(plain["loaded"]) < len(PRELOADED), plain["loaded"]
    assert runners["backend"] == plain["backend"] == "module://matplotlib_inline.backend_inline"
    for seen in ("threads", "path", "cwd", "environ"):
        assert runners[seen] == plain[seen], seen


def test_only_ipykernels_launcher_in_this_interpreter_is_replaced():
    """A kernel command of another interpreter (which may not have this library) or another
    kernel is started as its kernel spec says."""
    def command(argv):
        km = ChapterKernelManager(kernel_name="python3")
        km._kernel_spec = KernelSpec(argv=argv, display_name="x", language="python")
        return km.format_kernel_cmd()

    tail = ["-f", "{connection_file}"]
    assert command([sys.executable, "-m", "ipykernel_launcher", *tail])[:3] == [
        sys.executable, "-m", "attention_dynamics.book.kernel"]
    other = ["/opt/other/bin/python3", "-m", "ipykernel_launcher", *tail]
    assert command(other)[:3] == other[:3]
    assert command([sys.executable, "-m", "some_other_kernel", *tail])[:3] == [sys.executable, "-m", "some_other_kernel"]
