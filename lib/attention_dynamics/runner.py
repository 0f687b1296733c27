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
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Executor, FIRST_EXCEPTION, wait
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import __version__
from .records import write_json_atomic

__all__ = ["Job", "JobResult", "NotebookFailed", "load_profiles", "make_jobs", "make_grid_jobs", "execute", "run_jobs",
           "build_book", "provenance_markdown", "launch_links", "parse_value", "format_value", "main"]

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


# --- parameter values: read from the command line and profiles.yml, written into footers ---

class _ValueLoader(yaml.SafeLoader):
    """YAML as PyYAML reads it, plus the floats YAML 1.2 allows and YAML 1.1 does not
    (1e-05, 2E3, 1.5e3): without this, a value such as 1e-05 comes back as a string."""


_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_value(text: str, where: str = "value"):
    """A parameter value written as YAML (numbers, strings, true/false, null, [lists],
    {mappings}); ``where`` names it in the one-line error a malformed value gets."""
    try:
        return yaml.load(text, Loader=_ValueLoader)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{where}: cannot read {text!r} as a YAML value ({problem})") from None


def format_value(v) -> str:
    """The inverse of :func:`parse_value`, in YAML flow style that plain ``yaml.safe_load``
    (papermill's ``-y``) reads back to the same value too: floats always carry a dot
    before their exponent (1.0e-05), strings are double-quoted."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        r = repr(v)
        if "e" in r:
            mantissa, exponent = r.split("e")
            r = (mantissa if "." in mantissa else mantissa + ".0") + "e" + exponent
        return r
    if isinstance(v, str):
        # a JSON string is a YAML double-quoted one, except that YAML spells a character
        # beyond the BMP as one \UXXXXXXXX escape where JSON writes a surrogate pair
        return re.sub(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})",
                      lambda m: "\\U%08x" % (0x10000 + ((int(m[1], 16) - 0xD800) << 10) + int(m[2], 16) - 0xDC00),
                      json.dumps(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{format_value(str(k))}: {format_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write a parameter of type {type(v).__name__}: {v!r}")


def load_profiles(root: Path) -> dict[str, dict[str, dict]]:
    """notebooks/profiles.yml: chapter -> {"quick": {...}, "paper": {...}}, in book order.
    Malformed files fail with one line naming the file and the entry."""
    path = root / "notebooks" / "profiles.yml"
    where = "notebooks/profiles.yml"
    try:
        profiles = yaml.load(path.read_text(encoding="utf-8"), Loader=_ValueLoader)
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{where} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if profiles is None:
        raise ValueError(f"{where} is empty; it must map chapter names to their profiles")
    if not isinstance(profiles, dict):
        raise ValueError(f"{where} must map chapter names to their profiles, got a {type(profiles).__name__}")
    for name, entry in profiles.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: chapter '{name}' must map the profiles {list(PROFILES)} to parameters, "
                             f"got {format_value(entry) if entry is None else type(entry).__name__}")
        missing = [p for p in PROFILES if p not in entry]
        if missing:
            raise ValueError(f"{where}: chapter '{name}' lacks the profile(s) {missing}")
        for prof in PROFILES:
            params = entry[prof]
            if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
                raise ValueError(f"{where}: profile '{prof}' of chapter '{name}' must map parameter names to values "
                                 f"(write {{}} for none), got {format_value(params) if params is None else type(params).__name__}")
        if not (root / "notebooks" / f"{name}.ipynb").is_file():
            raise FileNotFoundError(f"{where} names '{name}' but notebooks/{name}.ipynb does not exist")
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
    out_dir = check_out_dir(Path(out_dir or root / "book" / "chapters"))
    jobs = []
    for n in names:
        params = dict(profiles[n][profile])
        for key, value in (overrides or {}).items():
            params[key] = value
        _check_parameters(n, root / "notebooks" / f"{n}.ipynb", params)
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
    runner, papermill = reproduce_commands(job, rel)
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
        "papermill_command": papermill,
        "runner_command_explicit": runner,
    }


def reproduce_commands(job: Job, notebook_rel: str) -> tuple[str, str]:
    """The runner and papermill commands that redo ``job`` exactly, shell-quoted, with every
    parameter written so that both parsers read back the value that was run."""
    sets = " ".join(f"--set {shlex.quote(f'{k}={format_value(v)}')}" for k, v in job.parameters.items())
    runner = f"python -m attention_dynamics.runner --profile {job.profile} --only {job.name} {sets}".strip()
    values = dict(sorted(job.parameters.items()), profile=job.profile)
    papermill = f"papermill {shlex.quote(notebook_rel)} {shlex.quote(job.stem + '.ipynb')} -y {shlex.quote(format_value(values))}"
    return runner, papermill


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
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"its record cannot be read ({type(e).__name__})"
    return JobResult(job.stem, "cached", 0.0, record), ""


# The kernel warns on every start that it talks over local TCP; it is local, and the warning
# would print once per chapter. Errors still reach the terminal.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


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
        _append_provenance(tmp_nb, record["provenance"], repository(Path(job.root)))
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
    ap.add_argument("--workers", type=int, help="run the grid on a local process pool of this size (at least 1)")
    ap.add_argument("--scheduler", metavar="ADDRESS", help="run the grid on a Dask cluster (e.g. tcp://host:8786)")
    args = ap.parse_args(argv)
    if args.book and (args.only or args.set or args.out or args.grid):
        ap.error("--book builds every chapter into book/chapters; it does not combine with --only, --set, --grid or --out")
    if (args.workers is not None or args.scheduler) and not args.grid:
        ap.error("--workers and --scheduler run a --grid")
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
            results = run_jobs(jobs)
    except (NotebookFailed, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the outputs of finished chapters are kept, nothing half-written is left", file=sys.stderr)
        return 130
    print(timing_table(results))
    if args.book:
        html = build_book(root / "book")
        print(f"book written to {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
