"""What an edit to library files or notebooks costs before main is green again: the
chapters whose cache key it changes, the stored models whose key it changes, and the
time a paper build of just those takes, from the seconds in the committed records.

A chapter's key covers its notebook, its paper parameters and the library modules it
imports, transitively, with the C sources of the packages among them
(:func:`attention_dynamics.sources.chapter_modules`); a stored model's key covers the
closure of the module that stores it (``load_or_make(kind, ..., modules=[__name__])``), its
settings and the computation paths planned on the processor that makes it. An edit that
changes a chapter's key makes its record in results/paper stale (tests/test_paper_results.py
turns red) until the chapter is built again at the paper profile, which costs

- **with the records' store**: the stale chapters, and the stale models among those they
  use; a store that holds every recorded model, which no one machine has where the records
  come from machines of different kinds (the planned paths are part of a model's key);
- **from an empty store**: the stale chapters and every model they use, stale or not (what
  a fresh machine pays, and any machine of another kind than the records' own).

Both scheduled on W workers by benchmarks/book_schedule.py's models as tasks (every model a
task of its own: what the runner's plans give at best), with its lower bound. The seconds
are the records': a chapter's own seconds were measured on the processor its record names;
a model's wherever it was trained (a record lists only its file, seconds and whether it was
loaded). Another machine kind scales them.

What it does not see:
- models asked for with other settings: an edit that changes what a chapter asks for (its
  notebook, or a module that chooses settings, such as the tuned comparisons' rates) calls
  for new models that this count leaves out; the stale models are those whose key moves
  through the code that stores them;
- a kind stored by two modules (windtunnel: the CPU run and the CUDA one) counts as stale
  when the edit reaches either: the record does not say which stored it;
- docstrings and comments of a Python file are outside every key: this answers for an edit
  of the code (a C file is keyed byte for byte, comments included).

    .venv/bin/python benchmarks/rebuild_cost.py lib/attention_dynamics/native/causal_head.c
    .venv/bin/python benchmarks/rebuild_cost.py lib/attention_dynamics/causal_head.py --workers 2 16
    .venv/bin/python benchmarks/rebuild_cost.py notebooks/routing_law.ipynb

A benchmark, not a test: it reads the committed records and the sources as they are now.
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from attention_dynamics.artifacts import KEY_DIGITS
from attention_dynamics.book.jobs import RESULTS, make_jobs
from attention_dynamics.sources import PACKAGE, PACKAGE_DIR, PLUMBING, SOURCE_SUFFIXES, chapter_modules, module_closure
from attention_dynamics.store import own_seconds, recorded_models

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("book_schedule", ROOT / "benchmarks" / "book_schedule.py")
book_schedule = importlib.util.module_from_spec(_spec)
sys.modules["book_schedule"] = book_schedule  # its dataclasses look their module up
_spec.loader.exec_module(book_schedule)

MODEL_FILE = re.compile(rf"^(?P<kind>.+)-[0-9a-f]{{{KEY_DIGITS}}}\.pt$")


def model_kind(file: str) -> str:
    """The kind of a stored model's file name (``sticky-protocol-862d43...pt`` -> ``sticky-protocol``)."""
    m = MODEL_FILE.match(file)
    if m is None:
        raise ValueError(f"not the name of a stored model (KIND-<{KEY_DIGITS} hex digits>.pt): {file!r}")
    return m["kind"]


@functools.cache  # the package's sources, parsed once per process
def storing_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """kind -> the modules that store models of that kind: the first argument of each
    ``load_or_make`` call, a string constant, or a parameter of the function around the call
    (as in tuned_trials' ``_stored(kind, ...)``), whose kinds are then the string constants
    that calls of that function in the same module pass in its place. Anything else is
    refused, as is a call whose ``modules`` is not ``[__name__]``: this script would not know
    what its key covers."""
    kinds: dict[str, set[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        dotted = ".".join((PACKAGE, *path.relative_to(package_dir).with_suffix("").parts)).removesuffix(".__init__")
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called(n) == "load_or_make"]:
            where = f"{dotted}, line {call.lineno}"
            given = {k.arg: k.value for k in call.keywords}
            modules = given.get("modules")
            if not (isinstance(modules, ast.List) and len(modules.elts) == 1
                    and getattr(modules.elts[0], "id", None) == "__name__"):
                raise ValueError(f"{where}: a load_or_make call whose modules are not [__name__]; "
                                 f"teach benchmarks/rebuild_cost.py what its key covers")
            first = call.args[0] if call.args else given.get("kind")
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                kinds.setdefault(first.value, set()).add(dotted)
                continue
            around = [f for f in functions if f.lineno <= call.lineno <= f.end_lineno
                      and isinstance(first, ast.Name) and first.id in [a.arg for a in f.args.args]]
            if not around:
                raise ValueError(f"{where}: load_or_make's kind is neither a string nor a parameter of the "
                                 f"function around it")
            helper = around[-1]  # the innermost
            position = [a.arg for a in helper.args.args].index(first.id)
            passed = [n.args[position] for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and _called(n) == helper.name and len(n.args) > position]
            if not passed or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in passed):
                raise ValueError(f"{where}: the kinds passed to {helper.name}() are not all string constants")
            for a in passed:
                kinds.setdefault(a.value, set()).add(dotted)
    return kinds


def _called(call: ast.Call) -> str | None:
    return getattr(call.func, "id", getattr(call.func, "attr", None))


@dataclass
class Cost:
    chapters: list  # book_schedule.Chapter, the stale ones, each with every model it uses
    stale_models: dict[str, float]  # file -> training seconds
    records: int
    models: int
    cpus: set


def rebuild_cost(edited: list[Path], records: Path, root: Path = ROOT) -> Cost:
    """The stale chapters and models when ``edited`` (paths; library files or notebooks)
    change, with the records' seconds."""
    lib_files, notebooks = set(), set()
    jobs = make_jobs(root, "paper")
    for given in edited:
        p = given.resolve()
        if not p.is_file():
            raise ValueError(f"{given}: no such file")
        if p.suffix == ".ipynb" and p.parent == (root / "notebooks").resolve():
            if p.stem not in {j.name for j in jobs}:
                raise ValueError(f"{given}: not the notebook of a chapter of the book")
            notebooks.add(p.stem)
        elif PACKAGE_DIR in p.parents and p.name == "speed.json":
            raise ValueError(f"{given}: the kernels' measured speeds choose the computation paths, which are in "
                             f"the key of every stored model on a processor whose choice they change, and in "
                             f"no chapter's key (the runner runs a chapter again whose record took other paths)")
        elif PACKAGE_DIR in p.parents and p.suffix in (".py", *SOURCE_SUFFIXES):
            lib_files.add(p)
        elif PACKAGE_DIR in p.parents:
            raise ValueError(f"{given}: not a library source (.py, {', '.join(SOURCE_SUFFIXES)}); its part in the "
                             f"keys is not known here")
        else:
            raise ValueError(f"{p}: neither a file of {PACKAGE_DIR} nor a chapter notebook in notebooks/ "
                             f"(a change of notebooks/profiles.yml moves the keys of the chapters whose paper "
                             f"parameters it changes: name their notebooks)")
    kinds = storing_modules()
    closures: dict[str, set[Path]] = {}
    chapters, stale_models, cpus, n_records, all_models = [], {}, set(), 0, set()
    for job in jobs:
        path = records / f"{job.name}.json"
        if not path.is_file():
            raise ValueError(f"{path}: no record of chapter {job.name}")
        prov = json.loads(path.read_text(encoding="utf-8"))["provenance"]
        n_records += 1
        cpus.add(f"{prov.get('cpu', '?')}, {prov.get('threads', '?')} thread(s)")
        models = {m["file"]: float(m["seconds"]) for m in recorded_models(prov.get("models"))}
        all_models |= set(models)
        for f, s in models.items():
            kind = model_kind(f)
            if kind not in kinds:
                raise ValueError(f"{f} (chapter {job.name}): no library module stores models of kind {kind!r}")
            for module in kinds[kind]:
                if module not in closures:
                    closures[module] = set(module_closure([module]))
                if closures[module] & lib_files:
                    stale_models[f] = s
        if job.name in notebooks or set(chapter_modules(job.notebook)) & lib_files:
            chapters.append(book_schedule.Chapter(job.name, own_seconds(prov), models))
    return Cost(chapters, stale_models, n_records, len(all_models), cpus)


def totals(cost: Cost) -> tuple[float, float, float]:
    """The stale chapters' own seconds, and the CPU-seconds of their rebuild with the
    records' store and from an empty one (each model once, however many chapters use it)."""
    used = {f: s for c in cost.chapters for f, s in c.models.items()}
    own = sum(c.own for c in cost.chapters)
    return own, own + sum(s for f, s in used.items() if f in cost.stale_models), own + sum(used.values())


def schedules(cost: Cost, workers: list[int]) -> list[tuple[int, float, float, float, float]]:
    """(workers, simulated wall and lower bound with the records' store, the same from
    an empty store) for each number of workers."""
    keep = [book_schedule.Chapter(c.name, c.own, {f: s for f, s in c.models.items() if f in cost.stale_models})
            for c in cost.chapters]
    rows = []
    for w in workers:
        row = [w]
        for chapters in (keep, cost.chapters):
            if chapters:
                row += [book_schedule.models_as_tasks(chapters, w, fresh=True)[0],
                        book_schedule.lower_bound(chapters, w, fresh=True)[0]]
            else:
                row += [0.0, 0.0]
        rows.append(tuple(row))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("edited", type=Path, nargs="+", help="library files or chapter notebooks whose code changes")
    ap.add_argument("--records", type=Path, default=ROOT / RESULTS, help="a folder of paper records (results/paper)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16])
    args = ap.parse_args(argv)
    if any(w < 1 for w in args.workers):
        ap.error("--workers takes whole numbers >= 1")
    try:
        cost = rebuild_cost(args.edited, args.records)
    except ValueError as e:
        sys.exit(f"rebuild_cost.py: {e}")
    used = {f: s for c in cost.chapters for f, s in c.models.items()}
    own, with_store, empty = totals(cost)
    print(f"records: {args.records} ({cost.records} chapters, {cost.models} stored models); the chapters' seconds "
          f"measured on {'; '.join(sorted(cost.cpus))}; the models' wherever they were trained")
    plumbing = [p for p in args.edited if ".".join((PACKAGE, *p.resolve().relative_to(PACKAGE_DIR).with_suffix("").parts))
                in PLUMBING] if any(PACKAGE_DIR in p.resolve().parents for p in args.edited) else []
    for p in plumbing:
        print(f"note: {p} is the store's plumbing, outside every key; a new STORE_FORMAT (artifacts.py) remakes "
              f"every stored model all the same")
    names = ", ".join(c.name for c in sorted(cost.chapters, key=lambda c: c.name)) or "none"
    print(f"stale chapters: {len(cost.chapters)} of {cost.records} ({names}), {own:.0f} s of their own")
    print(f"stale stored models: {len(cost.stale_models)} of {cost.models}, {sum(cost.stale_models.values()):.0f} s "
          f"of training; the stale chapters use {len(used)}, {sum(used.values()):.0f} s")
    print(f"to rebuild, with the records' store: {with_store:.0f} CPU-s; from an empty store: {empty:.0f} CPU-s "
          f"(models asked for with other settings not counted)")
    print(f"{'workers':>7}  {'records store: wall':>19}  {'bound':>7}  {'empty store: wall':>17}  {'bound':>7}  "
          f"(s, simulated: models as tasks, at best)")
    for w, keep_wall, keep_bound, empty_wall, empty_bound in schedules(cost, args.workers):
        print(f"{w:7d}  {keep_wall:19.0f}  {keep_bound:7.0f}  {empty_wall:17.0f}  {empty_bound:7.0f}")


if __name__ == "__main__":
    main()
