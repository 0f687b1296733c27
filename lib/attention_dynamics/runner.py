"""Execute the book's notebooks through papermill with a named parameter profile.

    python -m attention_dynamics.runner [--profile paper|quick] [--only NAME ...]
        [--set NAME=VALUE ...] [--out DIR] [--force] [--book]

Profiles live in ``notebooks/profiles.yml`` (one entry per chapter, in book order). Each
executed notebook goes to ``OUT/NAME.ipynb`` (default ``book/chapters``, ignored by git)
with its recorded numbers and their provenance in ``OUT/NAME.json``. A notebook whose
source, parameters and library code are unchanged since its last successful run is not
executed again. ``--book`` then builds the static HTML book and fails if any page shows
an error.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import __version__
from .records import read_record, write_json_atomic

__all__ = ["Job", "JobResult", "NotebookFailed", "load_profiles", "make_jobs", "make_grid_jobs", "execute", "run_jobs",
           "build_book", "provenance_markdown", "launch_links", "main"]

PROFILES = ("quick", "paper")
PACKAGE_DIR = Path(__file__).resolve().parent


def find_root(start: Path | None = None) -> Path:
    """The repository root: the first folder upward holding notebooks/profiles.yml."""
    for base in [Path(start or Path.cwd()).resolve(), PACKAGE_DIR]:
        for d in [base, *base.parents]:
            if (d / "notebooks" / "profiles.yml").is_file():
                return d
    raise FileNotFoundError("no notebooks/profiles.yml found above the current folder or the package")


class NotebookFailed(RuntimeError):
    def __init__(self, name: str, cell: int | None, ename: str, evalue: str, tail: str = ""):
        where = f"cell In[{cell}]" if cell is not None else "start-up"
        super().__init__(f"notebook '{name}' failed in {where}: {ename}: {evalue}" + (f"\n{tail}" if tail else ""))
        self.name, self.cell, self.ename, self.evalue = name, cell, ename, evalue


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


def load_profiles(root: Path) -> dict[str, dict[str, dict]]:
    with open(root / "notebooks" / "profiles.yml") as f:
        profiles = yaml.safe_load(f)
    for name, entry in profiles.items():
        missing = [p for p in PROFILES if p not in (entry or {})]
        if missing:
            raise ValueError(f"notebooks/profiles.yml: chapter '{name}' lacks the profile(s) {missing}")
        if not (root / "notebooks" / f"{name}.ipynb").is_file():
            raise FileNotFoundError(f"notebooks/profiles.yml names '{name}' but notebooks/{name}.ipynb does not exist")
    return profiles


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
    out_dir = Path(out_dir or root / "book" / "chapters").resolve()
    jobs = []
    for n in names:
        params = dict(profiles[n][profile])
        for key, value in (overrides or {}).items():
            params[key] = value
        _check_parameters(n, root / "notebooks" / f"{n}.ipynb", params)
        jobs.append(Job(n, str(root / "notebooks" / f"{n}.ipynb"), str(out_dir), profile, params, str(root), force))
    return jobs


RUNNER_PARAMETERS = ("record_path", "profile")


def _check_parameters(name: str, notebook: Path, params: dict) -> None:
    """Every parameter must exist in the notebook's parameters cell (papermill would only warn)."""
    import papermill as pm

    known = set(pm.inspect_notebook(str(notebook)))
    missing_runner = [p for p in RUNNER_PARAMETERS if p not in known]
    if missing_runner:
        raise ValueError(f"notebook '{name}' must declare {missing_runner} in its parameters cell")
    unknown = sorted(set(params) - known)
    if unknown:
        allowed = sorted(known - set(RUNNER_PARAMETERS))
        raise ValueError(f"chapter '{name}' has no parameter(s) {unknown}; its parameters are {allowed}")
    reserved = sorted(set(params) & set(RUNNER_PARAMETERS))
    if reserved:
        raise ValueError(f"{reserved} are set by the runner, not by profiles or --set")


def make_grid_jobs(root: Path, name: str, grid: dict[str, list], *, profile: str = "quick",
                   out_dir: Path | None = None, force: bool = False) -> list[Job]:
    """One job per point of a parameter grid (the product of the lists in ``grid``) over
    one chapter's profile, each with its own output files NAME--k1-v1_k2-v2.ipynb/.json.
    Run them with :func:`run_jobs` on any concurrent.futures executor."""
    import itertools

    if not grid or not all(isinstance(v, (list, tuple)) and v for v in grid.values()):
        raise ValueError("grid must map parameter names to non-empty lists of values")
    keys = list(grid)
    jobs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, values))
        (base,) = make_jobs(root, profile, only=[name], overrides=point, out_dir=out_dir, force=force)
        tag = "_".join(f"{k}-{json.dumps(v, separators=(',', ':'))}" for k, v in point.items())
        tag = "".join(c if c.isalnum() or c in "-_.," else "" for c in tag)
        jobs.append(Job(**{**base.__dict__, "tag": tag}))
    if len({j.tag for j in jobs}) != len(jobs):
        raise ValueError("two grid points map to the same output name; use simpler values")
    return jobs


def _library_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(p.relative_to(PACKAGE_DIR).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(job: Job) -> str:
    """Changes whenever the notebook's source, its parameters or the library change."""
    h = hashlib.sha256()
    h.update(Path(job.notebook).read_bytes())
    h.update(json.dumps({"profile": job.profile, "parameters": job.parameters}, sort_keys=True).encode())
    h.update(_library_digest().encode())
    return h.hexdigest()


def _git(root: str, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def provenance(job: Job, key: str, seconds: float) -> dict:
    import torch

    commit = _git(job.root, "rev-parse", "HEAD") or "unknown"
    dirty = bool(_git(job.root, "status", "--porcelain", "--untracked-files=no"))
    rel = os.path.relpath(job.notebook, job.root)
    sets = " ".join(f"--set '{k}={json.dumps(v, separators=(',', ':'))}'" for k, v in job.parameters.items())
    pm = f"-y '{json.dumps(job.parameters, separators=(',', ':'), sort_keys=True)}'"
    return {
        "chapter": job.name,
        "profile": job.profile,
        "parameters": job.parameters,
        "git_commit": commit,
        "git_dirty": dirty,
        "library_version": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "executed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 2),
        "cache_key": key,
        "runner_command": f"python -m attention_dynamics.runner --profile {job.profile} --only {job.name}",
        "papermill_command": f"papermill {rel} {job.name}.ipynb {pm}".strip(),
        "runner_command_explicit": f"python -m attention_dynamics.runner --profile {job.profile} --only {job.name} {sets}".strip(),
    }


def repository(root: Path) -> dict:
    """The repository address and branch, set once in book/_config.yml."""
    cfg_path = root / "book" / "_config.yml"
    if not cfg_path.is_file():
        return {}
    with open(cfg_path) as f:
        return (yaml.safe_load(f) or {}).get("repository", {}) or {}


def launch_links(repo: dict, name: str) -> dict[str, str]:
    """Binder and Colab addresses of notebooks/NAME.ipynb, for a GitHub repository."""
    url = str(repo.get("url", "")).rstrip("/")
    if not url.startswith("https://github.com/"):
        return {}
    slug, branch = url.removeprefix("https://github.com/"), repo.get("branch", "main")
    return {
        "Binder": f"https://mybinder.org/v2/gh/{slug}/{branch}?labpath=notebooks%2F{name}.ipynb",
        "Colab": f"https://colab.research.google.com/github/{slug}/blob/{branch}/notebooks/{name}.ipynb",
    }


def provenance_markdown(prov: dict, repo: dict) -> str:
    """The footer every chapter of the book ends with."""
    params = json.dumps(prov["parameters"], sort_keys=True)
    commit = prov["git_commit"][:12] + (" (with uncommitted changes)" if prov["git_dirty"] else "")
    links = launch_links(repo, prov["chapter"])
    lines = [
        "## Provenance",
        "",
        "Every number and figure on this page was computed by the notebook "
        f"`notebooks/{prov['chapter']}.ipynb` with these settings:",
        "",
        "| | |",
        "|---|---|",
        f"| profile | `{prov['profile']}` |",
        f"| parameters | `{params}` |",
        f"| library | `attention_dynamics` {prov['library_version']}, git commit `{commit}` |",
        f"| software | Python {prov['python']}, PyTorch {prov['torch']} |",
        f"| executed | {prov['executed_at']} in {prov['seconds']:.0f} s on {prov['machine']} |",
        "",
        "To reproduce it exactly, from the repository root:",
        "",
        "```bash",
        f".venv/bin/{prov['runner_command_explicit']} --out my-runs",
        "```",
        "",
        "or with papermill directly:",
        "",
        "```bash",
        f".venv/bin/{prov['papermill_command']}",
        "```",
    ]
    if links:
        lines += ["", "Run it in the cloud: " + " · ".join(f"[{k}]({v})" for k, v in links.items())
                  + " (see *Rerun a chapter* for the set-up each needs)."]
    return "\n".join(lines)


def _append_provenance(notebook: Path, prov: dict, repo: dict) -> None:
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for c in nb.cells:  # the runner's own bookkeeping is not part of the chapter
        if "injected-parameters" in c.metadata.get("tags", []):
            kept = [l for l in c.source.splitlines() if not l.startswith("record_path =") and l != "# Parameters"]
            c.source = "\n".join(["# Parameters of this run (set by the runner; see Provenance at the end)"] + kept)
    cell = nbformat.v4.new_markdown_cell(provenance_markdown(prov, repo))
    cell.metadata["tags"] = ["provenance"]
    nb.cells.append(cell)
    nbformat.write(nb, notebook)


def execute(job: Job, progress_bar: bool = False) -> JobResult:
    """Run one notebook; skip it when its last successful run had the same cache key."""
    import papermill as pm

    key = cache_key(job)
    if not job.force and job.output.is_file() and job.record.is_file():
        try:
            old = read_record(job.record)
            if old.get("provenance", {}).get("cache_key") == key:
                return JobResult(job.stem, "cached", 0.0, old)
        except (OSError, json.JSONDecodeError):
            pass
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{job.stem}-") as tmp:
        tmp_nb = Path(tmp) / f"{job.stem}.ipynb"
        tmp_rec = Path(tmp) / f"{job.stem}.json"
        params = dict(job.parameters, record_path=str(tmp_rec), profile=job.profile)
        start = time.perf_counter()
        try:
            pm.execute_notebook(job.notebook, str(tmp_nb), parameters=params, kernel_name="python3",
                                cwd=str(Path(job.notebook).parent), progress_bar=progress_bar,
                                request_save_on_cell_execute=False)
        except pm.PapermillExecutionError as e:
            frames = [_strip_ansi(t) for t in (e.traceback or []) if "Cell In[" in _strip_ansi(t)]
            tail = frames[-1].splitlines()[0] if frames else ""
            raise NotebookFailed(job.name, e.exec_count, e.ename, e.evalue, tail) from None
        except Exception as e:  # kernel death, bad parameters, missing kernel
            raise NotebookFailed(job.name, None, type(e).__name__, str(e)) from None
        seconds = time.perf_counter() - start
        if not tmp_rec.is_file():
            raise NotebookFailed(job.name, None, "MissingRecord", "the notebook ran but saved no record (call rec.save())")
        record = read_record(tmp_rec)
        record["provenance"] = provenance(job, key, seconds)
        _append_provenance(tmp_nb, record["provenance"], repository(Path(job.root)))
        # The notebook first, then the record that vouches for it: a crash in between
        # leaves a stale key, which only means the next run executes again.
        staged = job.output.with_name(f".{job.output.name}.tmp")
        shutil.copyfile(tmp_nb, staged)  # into the output folder first, so the rename is atomic
        os.replace(staged, job.output)
        write_json_atomic(job.record, record)
    return JobResult(job.stem, "ran", seconds, record)


def _strip_ansi(s: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", s)


def run_jobs(jobs: list[Job], executor: Executor | None = None, *, progress: bool = True) -> list[JobResult]:
    """Run jobs one after another, or on any concurrent.futures executor (a process
    pool, or a Dask cluster's ``client.get_executor()``). Stops at the first failure."""
    results: list[JobResult] = []
    total = len(jobs)
    if executor is None:
        for i, job in enumerate(jobs, 1):
            if progress:
                print(f"[{i}/{total}] {job.stem} ({job.profile}) ...", flush=True)
            r = execute(job, progress_bar=progress and sys.stderr.isatty())
            results.append(r)
            if progress:
                print(f"[{i}/{total}] {job.stem}: {r.status}" + (f" in {r.seconds:.1f} s" if r.status == "ran" else ""), flush=True)
        return results
    futures = [executor.submit(execute, job) for job in jobs]
    for i, (job, fut) in enumerate(zip(jobs, futures), 1):
        r = fut.result()
        results.append(r)
        if progress:
            print(f"[{i}/{total}] {job.stem}: {r.status}" + (f" in {r.seconds:.1f} s" if r.status == "ran" else ""), flush=True)
    return results


def timing_table(results: list[JobResult]) -> str:
    width = max([len(r.name) for r in results] + [7])
    lines = [f"{'chapter':<{width}}  status   seconds", f"{'-' * width}  ------  --------"]
    for r in results:
        secs = r.record.get("provenance", {}).get("seconds", r.seconds)
        lines.append(f"{r.name:<{width}}  {r.status:<6}  {secs:8.1f}")
    total = sum(r.seconds for r in results)
    lines.append(f"{'this run':<{width}}          {total:8.1f}")
    return "\n".join(lines)


def build_book(book: Path) -> Path:
    """Write the claims scorecard from the chapters' records, run jupyter-book build
    (warnings are errors), then refuse pages that show an error. ``book``: the folder with
    _config.yml, _toc.yml, the pages and chapters/ (the executed notebooks)."""
    from .scorecard import write_scorecard

    book = Path(book)
    write_scorecard(book / "chapters", book / "scorecard.md")
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe), "build", str(book), "--builder", "html", "-W", "-n", "--keep-going", "--quiet"]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=book).returncode != 0:
        raise SystemExit("jupyter-book build failed (see the warnings above)")
    html = book / "_build" / "html"
    bad = check_html(html)
    if bad:
        raise SystemExit("built pages show errors:\n" + "\n".join(bad))
    return html


ERROR_MARKERS = ("Traceback (most recent call last)", "output error", "output traceback", 'class="output stderr"')


def check_html(html_dir: Path) -> list[str]:
    bad = []
    for page in sorted(Path(html_dir).rglob("*.html")):
        text = page.read_text(errors="replace")
        for marker in ERROR_MARKERS:
            if marker in text:
                bad.append(f"{page.relative_to(html_dir)}: contains {marker!r}")
    return bad


def _run_grid(jobs: list[Job], workers: int, scheduler: str | None) -> list[JobResult]:
    if scheduler:
        from distributed import Client

        with Client(scheduler) as client:
            return run_jobs(jobs, client.get_executor())
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            return run_jobs(jobs, pool)
    return run_jobs(jobs)


def _parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set takes NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attention_dynamics.runner", description=__doc__,
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
    ap.add_argument("--workers", type=int, default=0, help="run the grid on a local process pool of this size")
    ap.add_argument("--scheduler", metavar="ADDRESS", help="run the grid on a Dask cluster (e.g. tcp://host:8786)")
    args = ap.parse_args(argv)
    root = find_root()
    if args.book and (args.only or args.set or args.out or args.grid):
        ap.error("--book builds every chapter into book/chapters; it does not combine with --only, --set, --grid or --out")
    if (args.workers or args.scheduler) and not args.grid:
        ap.error("--workers and --scheduler run a --grid")
    try:
        if args.grid:
            if not args.only or len(args.only) != 1:
                raise ValueError("--grid needs exactly one chapter named with --only")
            grid = _parse_set(args.grid)
            jobs = make_grid_jobs(root, args.only[0], grid, profile=args.profile, out_dir=args.out, force=args.force)
            results = _run_grid(jobs, args.workers, args.scheduler)
        else:
            jobs = make_jobs(root, args.profile, only=args.only, overrides=_parse_set(args.set),
                             out_dir=args.out, force=args.force)
            results = run_jobs(jobs)
    except (NotebookFailed, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(timing_table(results))
    if args.book:
        html = build_book(root / "book")
        print(f"book written to {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
