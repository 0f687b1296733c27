"""Execute the book's notebooks through papermill with a named parameter profile.

    python -m attention_dynamics.book [--profile paper|quick] [--only NAME ...]
        [--set NAME=VALUE ...] [--grid NAME=[V1,V2,...] ...] [--workers N | --scheduler ADDRESS]
        [--out DIR] [--force] [--book]

Profiles live in ``notebooks/profiles.yml`` (one entry per chapter, in book order). Each
executed notebook goes to ``OUT/NAME.ipynb`` (default ``book/chapters``, ignored by git)
with its recorded numbers and their provenance in ``OUT/NAME.json``. A notebook whose
source, parameters and library code are unchanged since its last successful run, and whose
outputs are intact, is not executed again. ``--book`` then builds the static HTML book and
fails if any page shows an error.

Chapters run side by side, ``--workers`` at a time (default: one per usable CPU), the
longest first (by the time their last run took), each with CPU count / workers threads
(``OMP_NUM_THREADS``), so that small-tensor chapters do not wait on a descheduled second
thread; ``--workers 1`` runs them one after another with every thread.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_EXCEPTION, Executor, wait
from dataclasses import dataclass, field
from pathlib import Path

from .build import build_book
from ..sources import chapter_modules, module_digest
from .profiles import PROFILES, check_parameters, find_root, format_value, load_profiles, parse_value
from .provenance import CLI, append_provenance, provenance, repository
from .records import write_json_atomic

__all__ = ["Job", "JobResult", "NotebookFailed", "make_jobs", "make_grid_jobs", "check_out_dir", "cache_key",
           "library_digest", "execute", "run_jobs", "run_chapters", "longest_first", "usable_cpus", "expected_seconds", "timing_table",
           "publish_paper_records", "main"]

RESULTS = Path("results") / "paper"  # under the repository root: the records of the last paper build


class NotebookFailed(RuntimeError):
    def __init__(self, name: str, cell: int | None, ename: str, evalue: str, tail: str = ""):
        where = f"cell In[{cell}]" if cell is not None else "start-up"
        super().__init__(f"notebook '{name}' failed in {where}: {ename}: {evalue}" + (f"\n{tail}" if tail else ""))
        self.name, self.cell, self.ename, self.evalue, self.tail = name, cell, ename, evalue, tail

    def __reduce__(self):
        # A worker process sends the failure back pickled; rebuild it from its parts, not from
        # the message (the default), so that the chapter, cell and cause survive the trip.
        return type(self), (self.name, self.cell, self.ename, self.evalue, self.tail)


@dataclass(frozen=True)
class Job:
    name: str
    notebook: str  # path of the source notebook
    out_dir: str
    profile: str
    parameters: dict
    root: str
    force: bool = False
    tag: str = ""  # distinguishes the points of a parameter grid

    @property
    def stem(self) -> str:
        return f"{self.name}--{self.tag}" if self.tag else self.name

    @property
    def output(self) -> Path:
        return Path(self.out_dir) / f"{self.stem}.ipynb"

    @property
    def record(self) -> Path:
        return Path(self.out_dir) / f"{self.stem}.json"


@dataclass
class JobResult:
    name: str
    status: str  # "ran" or "cached"
    seconds: float
    record: dict = field(default_factory=dict)


def make_jobs(root: Path, profile: str, *, only: list[str] | None = None, overrides: dict | None = None,
              out_dir: Path | None = None, force: bool = False) -> list[Job]:
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {list(PROFILES)}, got {profile!r}")
    profiles = load_profiles(root)
    names = list(profiles)
    if only:
        unknown = [n for n in only if n not in profiles]
        if unknown:
            raise ValueError(f"unknown chapter(s) {unknown}; known: {names}")
        names = [n for n in names if n in only]
    if overrides and len(names) != 1:
        raise ValueError("--set applies to one chapter: name it with --only")
    out_dir = check_out_dir(Path(out_dir or root / "book" / "chapters"))
    jobs = []
    for n in names:
        params = dict(profiles[n][profile])
        for key, value in (overrides or {}).items():
            params[key] = value
        check_parameters(n, root / "notebooks" / f"{n}.ipynb", params)
        jobs.append(Job(n, str(root / "notebooks" / f"{n}.ipynb"), str(out_dir), profile, params, str(root), force))
    return jobs


def check_out_dir(path: Path) -> Path:
    """The output folder, absolute; refused at once if it, or a folder above it, is a file."""
    path = Path(path).resolve()
    for d in [path, *path.parents]:
        if d.exists():
            if not d.is_dir():
                what = "is a file" if d == path else f"lies under {d}, which is a file"
                raise ValueError(f"--out {path} {what}, not a folder")
            break
    return path


def make_grid_jobs(root: Path, name: str, grid: dict[str, list], *, profile: str = "quick",
                   overrides: dict | None = None, out_dir: Path | None = None, force: bool = False) -> list[Job]:
    """One job per point of a parameter grid (the product of the lists in ``grid``) over
    one chapter's profile, with ``overrides`` (``--set``) applied to every point; each
    point has its own output files NAME--k1-v1_k2-v2.ipynb/.json. Run them with
    :func:`run_jobs` on any concurrent.futures executor."""
    import itertools

    if not grid or not all(isinstance(v, (list, tuple)) and v for v in grid.values()):
        raise ValueError("grid must map parameter names to non-empty lists of values")
    overrides = dict(overrides or {})
    both = sorted(set(grid) & set(overrides))
    if both:
        raise ValueError(f"{both} are set by both --set and --grid; give each parameter once")
    for key, values in grid.items():
        written = [format_value(v) for v in values]
        repeated = sorted({w for w in written if written.count(w) > 1})
        if repeated:
            raise ValueError(f"--grid {key} lists the value(s) {', '.join(repeated)} more than once")
    keys = list(grid)
    jobs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, values))
        (base,) = make_jobs(root, profile, only=[name], overrides={**overrides, **point}, out_dir=out_dir, force=force)
        tag = "_".join(f"{k}-{json.dumps(v, separators=(',', ':'))}" for k, v in point.items())
        tag = "".join(c if c.isalnum() or c in "-_.," else "" for c in tag)
        jobs.append(Job(**{**base.__dict__, "tag": tag}))
    stems = [j.stem for j in jobs]
    clash = sorted({s for s in stems if stems.count(s) > 1})
    if clash:
        raise ValueError(f"grid points map to the same output name {clash[0]!r} (only letters, digits and "
                         "'-_.,' are kept in file names); use values that differ in those")
    return jobs


def library_digest(job: Job) -> str:
    """The digest of the library modules the chapter imports (transitively)."""
    return module_digest(chapter_modules(Path(job.notebook)))


def cache_key(job: Job) -> str:
    """Changes whenever the notebook's source, its parameters or a library module it
    imports (directly or through other modules) change, and on nothing else."""
    h = hashlib.sha256()
    h.update(Path(job.notebook).read_bytes())
    h.update(json.dumps({"profile": job.profile, "parameters": job.parameters}, sort_keys=True).encode())
    h.update(library_digest(job).encode())
    return h.hexdigest()


def _same_paths(taken: dict) -> bool:
    """Whether a record's computation paths are the ones this machine would take now (a
    kernel and PyTorch train to different last digits; the cache key, shared by every
    machine, does not cover them)."""
    from ..native import planned_paths

    if not isinstance(taken, dict):  # a record from before paths were recorded
        return False
    planned = planned_paths()
    return all(planned.get(name) == str(path).split(" ")[0] for name, path in taken.items())


def _file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cached_result(job: Job, key: str) -> tuple[JobResult | None, str]:
    """The last run of ``job`` if it can be trusted: a record that parses as a dict with
    'values' and 'provenance' dicts, carries this cache key, and vouches (by its SHA-256)
    for the executed notebook beside it. Otherwise None and the reason, for the log."""
    if job.force:
        return None, ""
    if not (job.output.is_file() and job.record.is_file()):
        return None, ""
    try:
        record = json.loads(job.record.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            return None, "its record is not a JSON object"
        prov, values = record.get("provenance"), record.get("values")
        if not isinstance(prov, dict) or not isinstance(values, dict):
            return None, "its record lacks the 'values' or 'provenance' mapping"
        if prov.get("cache_key") != key:
            return None, ""  # changed since: the ordinary reason to run, nothing to report
        if prov.get("output_sha256") != _file_digest(job.output):
            return None, "its executed notebook does not match the record (damaged or edited)"
        if not _same_paths(prov.get("paths")):
            return None, "it ran through other computation paths than this machine takes now (kernels or PyTorch)"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"its record cannot be read ({type(e).__name__})"
    return JobResult(job.stem, "cached", 0.0, record), ""


# The kernel warns on every start that it talks over local TCP (it is local), and logs an
# ERROR for the interrupt jupyter_client sends before every shutdown: both would print once
# per chapter. A failing cell still reaches the reader, through papermill's exception.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _use_threads(threads: int) -> None:
    """In a worker: the kernels it starts (and their PyTorch) use this many threads."""
    for var in THREAD_VARIABLES:
        os.environ[var] = str(threads)


def expected_seconds(job: Job) -> float:
    """How long the chapter took last time: its record in the output folder, else (paper
    profile) the committed paper record; 0 when neither says."""
    for path in (job.record, Path(job.root) / RESULTS / f"{job.name}.json"):
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        prov = record.get("provenance", {})
        if prov.get("profile") == job.profile and isinstance(prov.get("seconds"), (int, float)):
            return float(prov["seconds"])
    return 0.0


def longest_first(jobs: list[Job]) -> list[Job]:
    """The jobs by the time their last run took, longest first (stable for ties)."""
    return sorted(jobs, key=expected_seconds, reverse=True)


def run_chapters(jobs: list[Job], workers: int | None = None, *, progress: bool = True) -> list[JobResult]:
    """Run chapters ``workers`` at a time (default: one per usable CPU, at most one per
    chapter), longest first, each worker's kernels with CPUs // workers threads; the results
    come back in the order of ``jobs``."""
    cpus = usable_cpus()
    workers = min(workers or cpus, len(jobs))
    if workers <= 1:
        return run_jobs(jobs, progress=progress)
    from concurrent.futures import ProcessPoolExecutor

    order = longest_first(jobs)
    threads = max(1, cpus // workers)
    if progress:
        print(f"{len(jobs)} chapters, {workers} side by side, {threads} thread(s) each", flush=True)
    with ProcessPoolExecutor(max_workers=workers, initializer=_use_threads, initargs=(threads,)) as pool:
        results = {r.name: r for r in run_jobs(order, pool, progress=progress)}
    return [results[j.stem] for j in jobs]


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
        bar = {"desc": job.stem, "leave": False, "ncols": shutil.get_terminal_size((80, 24)).columns} if progress_bar else False
        start = time.perf_counter()
        try:
            pm.execute_notebook(job.notebook, str(tmp_nb), parameters=params, kernel_name="python3",
                                cwd=str(Path(job.notebook).parent), progress_bar=bar,
                                request_save_on_cell_execute=False, extra_arguments=KERNEL_ARGUMENTS)
        except pm.PapermillExecutionError as e:
            frames = [_strip_ansi(t) for t in (e.traceback or []) if "Cell In[" in _strip_ansi(t)]
            tail = frames[-1].splitlines()[0] if frames else ""
            raise NotebookFailed(job.stem, e.exec_count, e.ename, e.evalue, tail) from None
        except Exception as e:  # kernel death, bad parameters, missing kernel
            raise NotebookFailed(job.stem, None, type(e).__name__, str(e)) from None
        seconds = time.perf_counter() - start
        if not tmp_rec.is_file():
            raise NotebookFailed(job.stem, None, "MissingRecord", "the notebook ran but saved no record (call rec.save())")
        record = json.loads(tmp_rec.read_text(encoding="utf-8"))
        record["provenance"] = provenance(job, key, seconds)
        record["provenance"]["paths"] = record.pop("paths", {})
        record["provenance"]["notebook_sha256"] = _file_digest(Path(job.notebook))
        record["provenance"]["library_digest"] = library_digest(job)
        append_provenance(tmp_nb, record["provenance"], repository(Path(job.root)))
        record["provenance"]["output_sha256"] = _file_digest(tmp_nb)
        # The notebook first, then the record that vouches for it: a crash in between
        # leaves a record whose digest does not match, which only means the next run
        # executes again.
        os.chmod(tmp_nb, 0o644)
        os.replace(tmp_nb, job.output)
        write_json_atomic(job.record, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return JobResult(job.stem, "ran", seconds, record)


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


def _report(i: int, total: int, r: JobResult) -> None:
    print(f"[{i}/{total}] {r.name}: {r.status}" + (f" in {r.seconds:.1f} s" if r.status == "ran" else ""), flush=True)


def run_jobs(jobs: list[Job], executor: Executor | None = None, *, progress: bool = True) -> list[JobResult]:
    """Run jobs one after another, or on any concurrent.futures executor (a process
    pool, or a Dask cluster's ``client.get_executor()``). Prints one line per finished
    chapter (and, on a terminal, a per-cell bar while one runs). Stops at the first
    failure: jobs not yet started are cancelled, running ones finish, then the failure
    (with its chapter, cell and cause) is raised."""
    results: list[JobResult] = []
    total = len(jobs)
    if executor is None:
        for i, job in enumerate(jobs, 1):
            r = execute(job, progress_bar=progress and sys.stderr.isatty())
            results.append(r)
            if progress:
                _report(i, total, r)
        return results
    futures = [executor.submit(execute, job) for job in jobs]
    done_count = 0
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for f in pending:
                f.cancel()
            wait(pending)  # running jobs finish and clean up after themselves
            raise failed[0].exception()
        for f in done:
            done_count += 1
            if progress:
                _report(done_count, total, f.result())
    return [f.result() for f in futures]


def publish_paper_records(root: Path, results: list[JobResult]) -> list[str]:
    """Copy the records of a paper build into results/paper/ (committed, so that CI checks
    paper-scale claims without the paper build) and say which claims changed beyond their
    tolerance, or changed verdict, against the records there before."""
    from .compare import compare
    from .scorecard import read_records

    folder = Path(root) / RESULTS
    before = read_records(folder) if folder.is_dir() else {}
    after = {r.name: r.record for r in results}
    for name, record in after.items():
        write_json_atomic(folder / f"{name}.json", record)
    lines = [f"paper records of {len(after)} chapter(s) written to {RESULTS}/"]
    if before:
        lines += ["against the records there before (python -m attention_dynamics.book.compare):"]
        try:
            lines += compare({k: v for k, v in before.items() if k in after}, after).lines()
        except Exception as e:  # the records are written; a failed comparison must not hide that
            lines += [f"the comparison failed: {type(e).__name__}: {e}"]
    return lines


def timing_table(results: list[JobResult], wall_seconds: float | None = None) -> str:
    """Each chapter's seconds (this run's, or its cached run's), threads and share of the
    sum; then the sum, and the wall-clock time of this run with the processor."""
    from ..machine import cpu_model

    width = max([len(r.name) for r in results] + [16])
    secs = [float(r.record.get("provenance", {}).get("seconds", r.seconds)) for r in results]
    whole = sum(secs) or 1.0
    lines = [f"{'chapter':<{width}}  status   seconds  threads  share",
             f"{'-' * width}  ------  --------  -------  -----"]
    for r, t in zip(results, secs):
        threads = r.record.get("provenance", {}).get("threads", "")
        lines.append(f"{r.name:<{width}}  {r.status:<6}  {t:8.1f}  {threads!s:>7}  {100 * t / whole:4.0f}%")
    lines.append(f"{'sum of chapters':<{width}}          {sum(secs):8.1f}")
    ran = sum(r.seconds for r in results)
    lines.append(f"{'executed now':<{width}}          {ran:8.1f}")
    if wall_seconds is not None:
        lines.append(f"{'wall clock':<{width}}          {wall_seconds:8.1f}  on {cpu_model()}, "
                     f"{usable_cpus()} CPUs")
    return "\n".join(lines)


SCHEDULER_TIMEOUT_S = 10


def _run_grid(jobs: list[Job], workers: int | None, scheduler: str | None) -> list[JobResult]:
    if scheduler:
        from distributed import Client

        try:
            client = Client(scheduler, timeout=f"{SCHEDULER_TIMEOUT_S}s")
        except Exception as e:  # OSError, TimeoutError, or a malformed address
            raise ValueError(f"cannot reach the Dask scheduler at {scheduler} within {SCHEDULER_TIMEOUT_S} s "
                             f"({type(e).__name__})") from None
        with client:
            return run_jobs(jobs, client.get_executor())
    if workers and workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            return run_jobs(jobs, pool)
    return run_jobs(jobs)


def _parse_assignments(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"{flag} takes NAME=VALUE, got {item!r}")
        k, v = (part.strip() for part in item.split("=", 1))
        if not k.isidentifier():
            raise ValueError(f"{flag} {item!r}: {k!r} is not a parameter name")
        if k in out:
            raise ValueError(f"{flag} sets {k!r} twice")
        out[k] = parse_value(v, f"{flag} {k}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=CLI, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=PROFILES, default="paper", help="parameter profile (default: paper)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these chapters")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override one parameter of the single chapter named by --only (YAML value)")
    ap.add_argument("--out", type=Path, help="where executed notebooks and records go (default: book/chapters)")
    ap.add_argument("--force", action="store_true", help="execute even when nothing changed")
    ap.add_argument("--book", action="store_true", help="then build the HTML book")
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=[V1,V2,...]",
                    help="run the chapter named by --only at every point of a parameter grid (YAML lists)")
    ap.add_argument("--workers", type=int, help="chapters (or grid points) run side by side on a local process "
                    "pool of this size (at least 1; default: one per usable CPU)")
    ap.add_argument("--scheduler", metavar="ADDRESS", help="run the grid on a Dask cluster (e.g. tcp://host:8786)")
    args = ap.parse_args(argv)
    if args.book and (args.only or args.set or args.out or args.grid):
        ap.error("--book builds every chapter into book/chapters; it does not combine with --only, --set, --grid or --out")
    if args.scheduler and not args.grid:
        ap.error("--scheduler runs a --grid")
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers must be at least 1, got {args.workers}")
    if args.workers is not None and args.scheduler:
        ap.error("--workers and --scheduler are two ways to run a grid; give one")
    try:
        root = find_root()
        overrides = _parse_assignments(args.set, "--set")
        if args.grid:
            if not args.only or len(args.only) != 1:
                raise ValueError("--grid needs exactly one chapter named with --only")
            grid = _parse_assignments(args.grid, "--grid")
            bad = [k for k, v in grid.items() if not isinstance(v, list) or not v]
            if bad:
                raise ValueError(f"--grid {bad[0]} must be a non-empty YAML list such as [1, 2], got {format_value(grid[bad[0]])}")
            jobs = make_grid_jobs(root, args.only[0], grid, profile=args.profile, overrides=overrides,
                                  out_dir=args.out, force=args.force)
            results = _run_grid(jobs, args.workers, args.scheduler)
        else:
            jobs = make_jobs(root, args.profile, only=args.only, overrides=overrides, out_dir=args.out, force=args.force)
            start = time.perf_counter()
            results = run_chapters(jobs, args.workers)
            wall = time.perf_counter() - start
    except (NotebookFailed, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the outputs of finished chapters are kept, nothing half-written is left", file=sys.stderr)
        return 130
    print(timing_table(results, None if args.grid else wall))
    if args.profile == "paper" and not (args.set or args.grid or args.out):
        for line in publish_paper_records(root, results):
            print(line)
    if args.book:
        html = build_book(root / "book")
        print(f"book written to {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
