"""Execute the book's notebooks through papermill with a named parameter profile.

    python -m attention_dynamics.book [--profile paper|quick|gpu] [--only NAME ...]
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
import sys
import time
from pathlib import Path

from .build import build_book
from .jobs import NotebookFailed, make_grid_jobs, make_jobs
from .profiles import ALL_PROFILES, find_root, format_value, parse_value
from .provenance import CLI
from .publishing import publish_paper_records
from .scheduling import run_chapters, run_grid
from .timetable import timing_table

__all__ = ["main"]


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


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=CLI, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=ALL_PROFILES, default="paper",
                    help="parameter profile (default: paper; gpu: the chapters that have one, at Paper I's size, "
                    "on a CUDA device where present)")
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
    ap.add_argument("--scheduler", metavar="ADDRESS", help="run the chapters (or the grid) on a Dask cluster "
                    "(e.g. tcp://host:8786); its workers share the repository's path and the model store")
    ap.add_argument("--no-plans", dest="plans", action="store_false",
                    help="let each chapter train its stored models itself (default: with more than one worker, "
                    "the models a chapter will ask for are made first, as tasks of their own)")
    return ap


def _check_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The combinations of flags that cannot work, refused before anything runs."""
    if args.book and (args.only or args.set or args.out or args.grid):
        ap.error("--book builds every chapter into book/chapters; it does not combine with --only, --set, --grid or --out")
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers must be at least 1, got {args.workers}")
    if args.workers is not None and args.scheduler:
        ap.error("--workers and --scheduler are two ways to run chapters side by side; give one")


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    _check_flags(ap, args)
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
            results = run_grid(jobs, args.workers, args.scheduler)
        else:
            jobs = make_jobs(root, args.profile, only=args.only, overrides=overrides, out_dir=args.out, force=args.force)
            start = time.perf_counter()
            results = run_chapters(jobs, args.workers, scheduler=args.scheduler, plans=args.plans)
            wall = time.perf_counter() - start
    except (NotebookFailed, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the outputs of finished chapters are kept, nothing half-written is left", file=sys.stderr)
        return 130
    print(timing_table(results, None if args.grid else wall, results.workers))
    if args.profile != "quick" and not (args.set or args.grid or args.out):
        for line in publish_paper_records(root, results, args.profile):
            print(line)
    if args.book:
        html = build_book(root / "book")
        print(f"book written to {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
