"""Running one chapter: papermill in a private work folder, the record stamped with its
provenance, and the outputs moved into place only when the notebook succeeded."""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from jupyter_client import AsyncKernelManager

from .cache import cache_key, cached_result, file_digest, library_digest
from .jobs import Job, JobResult, NotebookFailed
from .kernel import KERNEL_MODULE, PRELOAD_FLAG, PRELOADED
from .provenance import append_provenance, provenance, repository
from .templates import ChapterProvisioner
from ..sources import imports_at_run
from ..files import write_json_atomic

__all__ = ["execute", "KERNEL_ARGUMENTS", "ChapterKernelManager", "kernel_manager", "preloaded_for"]


# The kernel warns on every start that it talks over local TCP (it is local), and logs an
# ERROR for the interrupt jupyter_client sends before every shutdown: both would print once
# per chapter. A failing cell still reaches the reader, through papermill's exception.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]
# papermill gives a kernel 60 s to start; on a loaded machine (four processes on two cores,
# 2026-12-02) one took longer and the chapter failed in "start-up". Waiting longer costs a
# healthy start nothing.
KERNEL_START_TIMEOUT_S = 300
# Over TCP, jupyter_client finds each of a kernel's ports by binding port 0 and letting it
# go; the kernel binds the port a moment later, and another process can take it in between
# (two kernels starting on a Dask LocalCluster's workers did, 2026-12-02: "Address already
# in use"). The kernel then dies before any cell has run, jupyter_client's wait for it says
# so in these words, and the chapter can start again on new ports (a kernel that dies as it
# starts for another reason is started again too, to no harm: no cell had run). The dead
# kernel's traceback and nbclient's ERROR line stay on stderr, above the note. Unix sockets
# would close the window, but with them a kernel sometimes logged "Socket operation on
# non-socket" as it shut down.
DIED_AT_START = "Kernel died before replying to kernel_info"
KERNEL_START_ATTEMPTS = 3
IPYKERNEL_LAUNCHER = "ipykernel_launcher"


# What seaborn loads as it is imported (a chapter's plots import it through the library)
SEABORN_LOADS = frozenset({"numpy", "pandas", "matplotlib", "scipy.stats"})


class ChapterKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, starting the runner's kernel
    (:mod:`attention_dynamics.book.kernel`) with the libraries of :attr:`preload` loaded
    before the first cell, where the kernel's command is ipykernel's own launcher in this
    interpreter, the one that has this library. With nothing to preload, or any other kernel
    command, the kernel starts as its kernel spec says. The runner's kernel is forked from a
    template that has loaded the libraries once (:mod:`attention_dynamics.book.templates`)
    where one can serve."""

    preload: tuple[str, ...] = PRELOADED

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.preload and cmd[:3] == [sys.executable, "-m", IPYKERNEL_LAUNCHER]:
            cmd[2:3] = [KERNEL_MODULE, PRELOAD_FLAG, ",".join(self.preload)]
        return cmd

    async def _async_pre_start_kernel(self, **kw):
        self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
        if self.provisioner is None:  # in place of the kernel spec's, jupyter_client's local one
            self.provisioner = ChapterProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)


def preloaded_for(notebook: Path) -> tuple[str, ...]:
    """The libraries of :data:`PRELOADED` that the notebook loads as its cells run
    (:func:`attention_dynamics.sources.imports_at_run`), directly or through seaborn, so that
    nothing is loaded that a plain kernel would not load. A notebook that loads none of them
    starts in a plain kernel, whose start the preloading would slow."""
    names = imports_at_run(notebook)
    tops = {n.split(".")[0] for n in names}
    return tuple(m for m in PRELOADED if m in names or ("." not in m and m in tops)
                 or ("seaborn" in tops and m in SEABORN_LOADS))


@functools.lru_cache(maxsize=None)
def kernel_manager(preload: tuple[str, ...]) -> type:
    """:class:`ChapterKernelManager` loading ``preload`` (one class per set, for papermill,
    which takes a class); ``()`` starts the plain kernel."""
    return type("ChapterKernelManager", (ChapterKernelManager,), {"preload": preload})


def execute(job: Job, progress_bar: bool = False) -> JobResult:
    """Run one notebook; skip it when its last successful run had the same cache key and
    its outputs are intact. Works in a private folder inside the output folder and moves
    the results into place only when the notebook succeeded, so a failure or an
    interruption leaves the last good outputs (and nothing half-written) behind."""
    import papermill as pm

    key = cache_key(job)
    hit, why = cached_result(job, key)
    if hit is not None:
        return hit
    if why:
        print(f"note: {job.stem}: {why}; executing it again", file=sys.stderr, flush=True)
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_work_dirs(out_dir, job.stem)
    tmp = Path(tempfile.mkdtemp(prefix=f".{job.stem}.pid{os.getpid()}.", suffix=".running", dir=out_dir))
    try:
        tmp_nb = tmp / f"{job.stem}.ipynb"
        tmp_rec = tmp / f"{job.stem}.json"
        params = dict(job.parameters, record_path=str(tmp_rec), profile=job.profile)
        manager = kernel_manager(preloaded_for(Path(job.notebook)))
        bar = {"desc": job.stem, "leave": False, "ncols": shutil.get_terminal_size((80, 24)).columns} if progress_bar else False
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            start = time.perf_counter()  # the chapter's seconds are its last start's
            try:
                pm.execute_notebook(job.notebook, str(tmp_nb), parameters=params, kernel_name="python3",
                                    cwd=str(Path(job.notebook).parent), progress_bar=bar,
                                    request_save_on_cell_execute=False, extra_arguments=KERNEL_ARGUMENTS,
                                    start_timeout=KERNEL_START_TIMEOUT_S, kernel_manager_class=manager)
                break
            except pm.PapermillExecutionError as e:
                frames = [_strip_ansi(t) for t in (e.traceback or []) if "Cell In[" in _strip_ansi(t)]
                tail = frames[-1].splitlines()[0] if frames else ""
                raise NotebookFailed(job.stem, e.exec_count, e.ename, e.evalue, tail) from None
            except RuntimeError as e:
                if DIED_AT_START not in str(e) or attempt == KERNEL_START_ATTEMPTS:
                    raise NotebookFailed(job.stem, None, type(e).__name__, str(e)) from None
                print(f"note: {job.stem}: the kernel died as it started (attempt {attempt} of "
                      f"{KERNEL_START_ATTEMPTS}; no cell had run); starting it again", file=sys.stderr, flush=True)
            except Exception as e:  # bad parameters, missing kernel
                raise NotebookFailed(job.stem, None, type(e).__name__, str(e)) from None
        seconds = time.perf_counter() - start
        if not tmp_rec.is_file():
            raise NotebookFailed(job.stem, None, "MissingRecord", "the notebook ran but saved no record (call rec.save())")
        record = _stamped_record(job, key, seconds, tmp_nb, tmp_rec)
        # The notebook first, then the record that vouches for it: a crash in between
        # leaves a record whose SHA-256 does not match, which only means the next run
        # executes again.
        os.chmod(tmp_nb, 0o644)
        os.replace(tmp_nb, job.output)
        write_json_atomic(job.record, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return JobResult(job.stem, "ran", seconds, record)


def _stamped_record(job: Job, key: str, seconds: float, tmp_nb: Path, tmp_rec: Path) -> dict:
    """The record the notebook saved, with its provenance: the run's, the computation paths
    it took, the SHA-256 of the source notebook and of the library it imports, and (after
    the provenance footer is appended to the executed notebook) that notebook's SHA-256."""
    record = json.loads(tmp_rec.read_text(encoding="utf-8"))
    record["provenance"] = provenance(job, key, seconds)
    record["provenance"]["paths"] = record.pop("paths", {})
    record["provenance"]["models"] = record.pop("models", [])
    if isinstance(record.get("values"), dict) and isinstance(record["values"].get("device"), str):
        # where a chapter that chooses its device trained (the gpu profile): beside the CPU
        record["provenance"]["device"] = record["values"]["device"]
    record["provenance"]["notebook_sha256"] = file_digest(Path(job.notebook))
    record["provenance"]["library_digest"] = library_digest(job)
    append_provenance(tmp_nb, record["provenance"], repository(Path(job.root)))
    record["provenance"]["output_sha256"] = file_digest(tmp_nb)
    return record


def _remove_stale_work_dirs(out_dir: Path, stem: str) -> None:
    """Work folders of runs of this chapter whose process no longer exists (killed
    without a chance to clean up)."""
    for d in out_dir.glob(f".{stem}.pid*.running"):
        m = re.match(rf"^\.{re.escape(stem)}\.pid(\d+)\.", d.name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _strip_ansi(s: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", s)
