"""What a chapter's kernel costs before and after the chapter's own work: jupyter_client's
plain kernel (``python -m ipykernel_launcher``) against the runner's
(:mod:`attention_dynamics.book.kernel`: the libraries every chapter imports loaded first with
the collector off, then frozen out of its passes), side by side, the order of the two
alternating from one repeat to the next so that a drift of the machine falls on both.

For each kernel: seconds to start (until it answers), to run the imports a chapter's first
cell makes, to shut down; the full collections (``gc.collect()``) a chapter's run makes
several of; and one whole chapter at the quick profile through the runner (``execute``, in a
fresh output folder). A benchmark, not a test: timings depend on the machine; the ratios are
what count.

    .venv/bin/python benchmarks/kernel_start.py                       # 5 repeats, routing_law
    .venv/bin/python benchmarks/kernel_start.py --repeats 9 --chapter value_law
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from jupyter_client import AsyncKernelManager

from attention_dynamics.book import execution
from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.kernel import ChapterKernelManager
from attention_dynamics.book.profiles import find_root
from attention_dynamics.machine import cpu_model

# the first code cell of a chapter, after the Colab install cell (sticky_chain_deep's)
CHAPTER_IMPORTS = ("import math, time\nimport numpy as np\nimport pandas as pd\nimport torch\n"
                   "import matplotlib.pyplot as plt\nimport seaborn as sns\n"
                   "from attention_dynamics.book.chapter import start_chapter\n"
                   "from attention_dynamics.plotting import band")
FULL_COLLECTION = "import gc, time as _t\n_s = _t.perf_counter(); gc.collect(); print(_t.perf_counter() - _s)"
KERNELS = {"plain": AsyncKernelManager, "runner's": ChapterKernelManager}


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


def _chapter(manager: type, name: str, root: Path) -> float:
    out = Path(tempfile.mkdtemp(prefix="kernel-start-"))
    try:
        execution.ChapterKernelManager = manager  # the runner's kernel, or jupyter_client's own
        (job,) = make_jobs(root, "quick", only=[name], out_dir=out)
        return execution.execute(job).seconds
    finally:
        execution.ChapterKernelManager = ChapterKernelManager
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chapter", default="routing_law", help="a chapter that trains no stored model")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    root = find_root()
    samples = {k: [] for k in KERNELS}
    for i in range(args.repeats):
        for label in (list(KERNELS) if i % 2 == 0 else list(KERNELS)[::-1]):
            row = asyncio.run(_phases(KERNELS[label]))
            row["chapter"] = _chapter(KERNELS[label], args.chapter, root)
            samples[label].append(row)
            print(f"repeat {i + 1}, {label:8s} " + "  ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
    print(f"\nmedians of {args.repeats} on {cpu_model()}; chapter: {args.chapter} at the quick profile")
    print(f"{'':18s}" + "".join(f"{k:>12s}" for k in KERNELS) + f"{'ratio':>10s}")
    for phase in samples["plain"][0]:
        med = {k: statistics.median(r[phase] for r in samples[k]) for k in KERNELS}
        print(f"{phase:18s}" + "".join(f"{med[k]:11.2f}s" for k in KERNELS) + f"{med['plain'] / med[list(KERNELS)[1]]:9.2f}x")
    total = {k: statistics.median(r["start"] + r["imports"] + r["shutdown"] for r in samples[k]) for k in KERNELS}
    print(f"{'start+imports+stop':18s}" + "".join(f"{total[k]:11.2f}s" for k in KERNELS)
          + f"{total['plain'] / total[list(KERNELS)[1]]:9.2f}x")


if __name__ == "__main__":
    main()
