"""The quick book's chapters one after another (one worker with all the CPUs' threads)
against side by side (one worker per CPU, one thread each), on the idle machine and with a
competing process (a matrix-product loop with its library's default threads, as another
user's job would be), measured in this one run. Prints the wall clock of each and the ratios.

Each configuration executes every chapter (--force) into a scratch folder, with its own
empty store of trained models, so that no run profits from another's work.

    .venv/bin/python benchmarks/chapters_side_by_side.py                 # quick profile
    .venv/bin/python benchmarks/chapters_side_by_side.py --only specialization two_timescale_em

A benchmark, not a test: timings depend on the machine; the ratios are what count.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attention_dynamics.machine import cpu_model
from attention_dynamics.book.scheduling import usable_cpus

ROOT = Path(__file__).resolve().parents[1]
COMPETITOR = "import numpy as np\na = np.random.rand(1500, 1500)\nwhile True:\n    a @ a\n"


def build(workers: int, only: list[str] | None, scratch: Path) -> float:
    out, store = scratch / f"out-{workers}", scratch / f"artifacts-{workers}"
    env = dict(os.environ, ATTENTION_DYNAMICS_ARTIFACTS=str(store))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)  # the runner chooses
    cmd = [sys.executable, "-m", "attention_dynamics.book", "--profile", "quick", "--force", "--out", str(out),
           "--workers", str(workers)] + (["--only", *only] if only else [])
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the build with --workers {workers} failed:\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", help="chapters (default: all)")
    args = ap.parse_args()
    cpus = usable_cpus()
    if cpus < 2:
        sys.exit("one CPU: nothing to put side by side")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        scratch = Path(tmp)
        for load in ("idle", "busy"):
            rival = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if load == "busy" else None
            try:
                for workers in (1, cpus):
                    rows[(load, workers)] = build(workers, args.only, scratch / load)
                    print(f"{load:4s}  --workers {workers}: {rows[(load, workers)]:7.1f} s", flush=True)
            finally:
                if rival is not None:
                    rival.kill()
                    rival.wait()
    print(f"CPU: {cpu_model()}, {cpus} usable CPUs; quick profile, every chapter executed")
    print(f"{'':6s}{'one after another':>22s}{'side by side':>16s}{'ratio':>8s}")
    for load in ("idle", "busy"):
        a, b = rows[(load, 1)], rows[(load, cpus)]
        print(f"{load:6s}{a:20.1f} s{b:14.1f} s{a / b:7.2f}x")
    print(f"busy / idle: one after another {rows[('busy', 1)] / rows[('idle', 1)]:.2f}x, "
          f"side by side {rows[('busy', cpus)] / rows[('idle', cpus)]:.2f}x")


if __name__ == "__main__":
    main()
