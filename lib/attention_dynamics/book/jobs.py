"""What the runner runs: one chapter at one profile (a :class:`Job`), the jobs of a build
or of a parameter grid, what a finished one returns, and how a failed one is reported."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .profiles import ALL_PROFILES, PROFILES, check_parameters, format_value, load_profiles

__all__ = ["RESULTS", "results_folder", "default_out_dir", "Job", "JobResult", "NotebookFailed", "make_jobs",
           "make_grid_jobs", "check_out_dir"]


def results_folder(profile: str) -> Path:
    """Where a build at ``profile`` publishes its records, under the repository root:
    results/paper/ for the paper build, results/gpu/ for the accelerator's runs."""
    if profile == "quick" or profile not in ALL_PROFILES:
        raise ValueError(f"records are published for the profiles {[p for p in ALL_PROFILES if p != 'quick']}, "
                         f"got {profile!r}")
    return Path("results") / profile


RESULTS = results_folder("paper")  # the records of the last paper build


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
    planned: tuple[str, ...] = ()  # the stored models made for it first, as tasks (their files)
    planned_failed: tuple[str, ...] = ()  # the plan's tasks that failed (left to the chapter)
    planned_seconds: tuple[float, ...] = ()  # what each of ``planned`` took to make (or load)


def make_jobs(root: Path, profile: str, *, only: list[str] | None = None, overrides: dict | None = None,
              out_dir: Path | None = None, force: bool = False) -> list[Job]:
    if profile not in ALL_PROFILES:
        raise ValueError(f"profile must be one of {list(ALL_PROFILES)}, got {profile!r}")
    profiles = load_profiles(root)
    names = list(profiles)
    if only:
        unknown = [n for n in only if n not in profiles]
        if unknown:
            raise ValueError(f"unknown chapter(s) {unknown}; known: {names}")
        names = [n for n in names if n in only]
    if profile not in PROFILES:  # a profile some chapters have
        lacking = [n for n in names if profile not in profiles[n]] if only else []
        if lacking:
            raise ValueError(f"chapter(s) {lacking} have no '{profile}' profile; those that do: "
                             f"{[n for n in profiles if profile in profiles[n]]}")
        names = [n for n in names if profile in profiles[n]]
    if overrides and len(names) != 1:
        raise ValueError("--set applies to one chapter: name it with --only")
    out_dir = check_out_dir(Path(out_dir or default_out_dir(root, profile)))
    jobs = []
    for n in names:
        params = dict(profiles[n][profile])
        for key, value in (overrides or {}).items():
            params[key] = value
        check_parameters(n, root / "notebooks" / f"{n}.ipynb", params)
        jobs.append(Job(n, str(root / "notebooks" / f"{n}.ipynb"), str(out_dir), profile, params, str(root), force))
    return jobs


def default_out_dir(root: Path, profile: str) -> Path:
    """Where the runner writes a profile's executed chapters unless told: book/chapters, the
    book's, for quick and paper; book/chapters-gpu for the gpu runs, which the book does not
    show and which must not replace its chapters."""
    return Path(root) / "book" / ("chapters" if profile in PROFILES else f"chapters-{profile}")


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
