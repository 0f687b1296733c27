"""What a chapter's kernel costs before and after the chapter's own work: jupyter_client's
plain kernel (``python -m ipykernel_launcher``), the runner's kernel started as a process of
its own (:mod:`attention_dynamics.book.kernel`: the libraries every chapter imports loaded
before the first cell with the collector off, then frozen out of its passes; templates off),
and the runner's kernel forked from a template that has loaded them once
(:mod:`attention_dynamics.book.templates`), side by side, in the order ABC CBA ABC ... so that
a drift of the machine falls on all alike.

For each kernel: seconds to start (until it answers), to run the imports a chapter's first
cell makes, to shut down; the full collections (``gc.collect()``) a chapter's run makes
several of; and one whole chapter at the quick profile through the runner (``execute``, in a
fresh output folder). The template is started before the first timed start (a worker's first
chapter pays for it: about the runner's own start). A benchmark, not a test: timings depend
on the machine; the ratios are what count.

    .venv/bin/python benchmarks/kernel_start.py                       # 6 repeats, routing_law
    .venv/bin/python benchmarks/kernel_start.py --repeats 10 --chapter value_law
    .venv/bin/python benchmarks/kernel_start.py --book --repeats 2    # the whole quick book

``--book`` builds the whole quick book instead (``python -m attention_dynamics.book --profile
quick``, each build into a fresh folder with a fresh store of trained models, the local pool
of one worker per CPU) with each kernel, after one build that is not counted (the first build
of a session pays for what later ones find ready: compiled kernels, the page cache), and
prints each build's wall clock, its chapters' seconds summed and its models' seconds summed,
as the runner's time table says them.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attention_dynamics.book import execution
from attention_dynamics.book.execution import kernel_manager
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.kernel import PRELOADED
from attention_dynamics.book.templates import SWITCH
from attention_dynamics.book.profiles import find_root
from attention_dynamics.machine import cpu_model

# the first code cell of a chapter, after the Colab install cell (sticky_chain_deep's)
CHAPTER_IMPORTS = ("import math, time\nimport numpy as np\nimport pandas as pd\nimport torch\n"
                   "import matplotlib.pyplot as plt\nimport seaborn as sns\n"
                   "from attention_dynamics.book.chapter import start_chapter\n"
                   "from attention_dynamics.plotting import band")
FULL_COLLECTION = "import gc, time as _t\n_s = _t.perf_counter(); gc.collect(); print(_t.perf_counter() - _s)"
# nothing to preload starts jupyter_client's plain kernel; the runner's with templates off or on
KERNELS = {"plain": kernel_manager(()), "runner's": kernel_manager(PRELOADED), "forked": kernel_manager(PRELOADED)}
TEMPLATES = {"plain": "1", "runner's": "0", "forked": "1"}


async def _phases(manager: type) -> dict:
    km = manager(kernel_name="python3")
    start = time.perf_counter()
    await km.start_kernel(extra_arguments=execution.KERNEL_ARGUMENTS)
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    started = time.perf_counter()
    await kc.execute_interactive(CHAPTER_IMPORTS, timeout=120)
    imported = time.perf_counter()
    printed = []
    await kc.execute_interactive(FULL_COLLECTION, timeout=120,
                                 output_hook=lambda m: printed.append(m["content"].get("text", "")))
    kc.stop_channels()
    before = time.perf_counter()
    await km.shutdown_kernel()
    return {"start": started - start, "imports": imported - started, "full collection": float("".join(printed)),
            "shutdown": time.perf_counter() - before}


def _with_templates(label: str) -> None:
    os.environ[SWITCH] = TEMPLATES[label]


def _chapter(label: str, name: str, root: Path) -> float:
    out = Path(tempfile.mkdtemp(prefix="kernel-start-"))
    choose = execution.preloaded_for
    try:
        if label == "plain":
            execution.preloaded_for = lambda notebook: ()
        (job,) = make_jobs(root, "quick", only=[name], out_dir=out)
        return execution.execute(job).seconds
    finally:
        execution.preloaded_for = choose
        shutil.rmtree(out, ignore_errors=True)


# the runner with nothing to preload, so jupyter_client's plain kernel: the pool's workers fork
# from this process and keep the replacement, which a start method that does not fork (Python
# 3.14's default) would lose, so the build refuses to run under one
PLAIN_RUNNER = ("import multiprocessing, sys\n"
                "if multiprocessing.get_start_method() != 'fork':\n"
                "    sys.exit('the plain build needs workers that fork, to keep the plain kernel')\n"
                "from attention_dynamics.book import execution\n"
                "execution.preloaded_for = lambda notebook: ()\nfrom attention_dynamics.book.cli import main\n"
                "sys.exit(main(sys.argv[1:]))")
TIMETABLE = {"wall clock": r"^wall clock\s+([\d.]+)", "chapters summed": r"^sum of chapters\s+([\d.]+)",
             "models summed": r"^\d+ models first\s+([\d.]+)"}


def _book(label: str, root: Path) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="kernel-start-book-"))
    try:
        env = dict(os.environ, ATTENTION_DYNAMICS_ARTIFACTS=str(scratch / "store"), **{SWITCH: TEMPLATES[label]})
        runner = ["-c", PLAIN_RUNNER] if label == "plain" else ["-m", "attention_dynamics.book"]
        done = subprocess.run([sys.executable, *runner, "--profile", "quick", "--out", str(scratch / "out")],
                              cwd=root, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"the quick book with the {label} kernel failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        found = {k: re.search(pattern, done.stdout, re.M) for k, pattern in TIMETABLE.items()}
        if not all(found.values()):
            raise SystemExit(f"no time table in the output of the {label} kernel's build:\n{done.stdout[-2000:]}")
        return {k: float(m.group(1)) for k, m in found.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=6, help="an even number: each kernel goes first as often")
    ap.add_argument("--chapter", default="routing_law", help="a chapter that trains no stored model")
    ap.add_argument("--book", action="store_true", help="time whole quick books instead of one kernel and chapter")
    args = ap.parse_args()
    if args.repeats < 2 or args.repeats % 2:
        ap.error(f"--repeats must be an even number of at least 2, got {args.repeats}")
    root = find_root()
    samples = {k: [] for k in KERNELS}
    if args.book:
        print(f"warm-up build, not counted: wall clock {_book('forked', root)['wall clock']:.1f} s", flush=True)
    else:  # the template's own start, as a worker's first chapter pays it
        _with_templates("forked")
        asyncio.run(_phases(KERNELS["forked"]))
    for i in range(args.repeats):
        for label in (list(KERNELS) if i % 2 == 0 else list(KERNELS)[::-1]):
            if args.book:
                row = _book(label, root)
            else:
                _with_templates(label)
                row = asyncio.run(_phases(KERNELS[label]))
                row["chapter"] = _chapter(label, args.chapter, root)
            samples[label].append(row)
            print(f"repeat {i + 1}, {label:8s} " + "  ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
    for row in samples.values():
        for r in row:
            if not args.book:
                r["start+imports+stop"] = r["start"] + r["imports"] + r["shutdown"]
    what = "the quick book" if args.book else f"chapter: {args.chapter} at the quick profile"
    print(f"\nmedians (min-max) of {args.repeats} on {cpu_model()}; {what}")
    print(f"{'':20s}" + "".join(f"{k:>20s}" for k in KERNELS) + f"{'plain / forked':>16s}{'runner / forked':>17s}")
    for phase in samples["plain"][0]:
        cells, med = "", {}
        for k in KERNELS:
            xs = [r[phase] for r in samples[k]]
            med[k] = statistics.median(xs)
            cells += f"{med[k]:9.2f} ({min(xs):.2f}-{max(xs):.2f})".rjust(20)
        plain, runners, forked = (med[k] for k in KERNELS)
        print(f"{phase:20s}{cells}{plain / forked:15.2f}x{runners / forked:16.2f}x")


if __name__ == "__main__":
    main()
