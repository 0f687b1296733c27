#!/usr/bin/env python
"""A proposed change to a compiled kernel, measured beside the kernel it would replace,
without adopting it.

The kernels' C sources are in the key of every chapter and every stored model
(attention_dynamics.sources): editing one makes every committed paper record stale, and
only a paper build (hours on two cores) makes them again. So a faster kernel is first
proposed here, as a patch in benchmarks/proposed/, measured on the machines a session gets,
and adopted together with a paper build.

``proposed_sources(folder)`` copies the library's kernel sources (native/*.c, *.h) into
``folder`` and applies every patch of benchmarks/proposed/ (``git apply -p1``: a patch that no
longer applies to the current sources is an error naming it); ``built_from(folder)`` makes
the library build and load its kernels from there inside a ``with`` block
(tests/test_sticky_chain.py runs the closed-form checks of the causal head's kernel on the
proposed sources through it).

This script times the sticky-chain protocol's training (benchmarks/sticky_chain_speed.py's
loop: all runs batched, SGD, the closed-form backward) through three paths in one process,
on the same seeds and initial weights: the library's compiled kernel, the proposed one and
the PyTorch blocked path, --repeats times each in an order that rotates, so that a drift of
the machine falls on all three. It prints each path's median milliseconds per run-step,
their ratios, each path's rate of counted work (sticky_chain_speed.flop_per_run_step)
against a float32 matmul measured before and after with the same threads (the higher one),
and the largest difference of the paths' final losses (must be <= 1e-4, as in
sticky_chain_speed; the script exits 1 otherwise). A benchmark, not a test.

    .venv/bin/python benchmarks/proposed_kernel.py                 # 300 steps, 3 repeats
    .venv/bin/python benchmarks/proposed_kernel.py --steps 50 --repeats 2
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # run from anywhere, or loaded by path from a test

import attention_dynamics.native as native  # noqa: E402
from attention_dynamics.causal_head import D_K, D_V  # noqa: E402
from attention_dynamics.machine import cpu_model  # noqa: E402
from attention_dynamics.tasks import sticky_chain as sc  # noqa: E402

PATCHES = HERE / "proposed"


def proposed_sources(folder: Path, patches: Path = PATCHES) -> Path:
    """The library's kernel sources with every patch in ``patches`` (default
    benchmarks/proposed/) applied, in ``folder`` (created); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in native.HERE.iterdir():
        if f.suffix in (".c", ".h"):
            shutil.copy2(f, folder / f.name)
    for patch in sorted(patches.glob("*.patch")):
        # git apply, as patch(1) would (git is what cloned the repository); the ceiling keeps
        # it from taking a repository above the folder for the tree to patch
        done = subprocess.run(["git", "apply", "-p1", str(patch.resolve())], cwd=folder, capture_output=True, text=True,
                              env=dict(os.environ, GIT_CEILING_DIRECTORIES=str(folder.resolve().parent)))
        if done.returncode != 0:
            raise RuntimeError(f"{patch} does not apply to the library's kernel sources "
                               f"(they changed since it was written; remake it):\n{done.stdout}{done.stderr}")
    return folder


@contextlib.contextmanager
def built_from(folder: Path):
    """Inside the block the library builds and loads its kernels from ``folder`` (none of
    those loaded before is used); outside, from its own sources again."""
    with mock.patch.object(native, "HERE", folder), mock.patch.dict(native._loaded, {}, clear=True):
        yield


def main() -> int:
    from sticky_chain_speed import flop_per_run_step, matmul_gflops, time_fast

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="training steps per run and repeat (default 300)")
    ap.add_argument("--repeats", type=int, default=3, help="timings of each path (default 3)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(sc.SEEDS), help="seeds (protocol: the five of the paper)")
    ap.add_argument("--seq-len", type=int, default=2000, help="states per sequence (protocol: 2000)")
    args = ap.parse_args()
    if min(args.steps, args.repeats) < 1 or args.seq_len < 2:
        ap.error("--steps and --repeats must be >= 1 and --seq-len >= 2")
    patches = sorted(p.name for p in PATCHES.glob("*.patch"))
    if not patches:
        ap.error(f"no patch in {PATCHES}")

    threads = torch.get_num_threads()
    peaks = [matmul_gflops(threads)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = proposed_sources(Path(tmp) / "native")
        paths = {"library kernel": (contextlib.nullcontext, True),
                 "proposed kernel": (lambda: built_from(folder), True),
                 "PyTorch blocked path": (contextlib.nullcontext, False)}
        ms = {name: [] for name in paths}
        finals = {}
        names = list(paths)
        print(f"{2 * len(args.seeds)} runs x {args.steps} steps, T = {args.seq_len - 1} positions, {threads} threads; "
              f"proposed: {', '.join(patches)}")
        for rep in range(args.repeats):
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                context, kernel = paths[name]
                with context():
                    final, step_ms, _, _ = time_fast(args.seeds, args.seq_len, args.steps, 64, kernel)
                ms[name].append(step_ms)
                finals[name] = np.asarray(final)
                print(f"  repeat {rep + 1}: {name:22s} {step_ms:7.2f} ms per run-step", flush=True)
    peaks.append(matmul_gflops(threads))
    peak = max(peaks)
    flop = flop_per_run_step(args.seq_len - 1, sc.D_X, D_K, D_V, sc.N_STATES)
    print(f"CPU: {cpu_model()}, {threads} threads; float32 matmul (1024^3): {peak:.1f} GFLOP/s "
          f"(the higher of {', '.join(f'{p:.1f}' for p in peaks)}, before and after)")
    med = {name: statistics.median(v) for name, v in ms.items()}
    for name, m in med.items():
        rate = flop / (m / 1000) / 1e9
        print(f"{name:22s}: median {m:7.2f} ms per run-step (of {len(ms[name])}: "
              f"{', '.join(f'{v:.2f}' for v in ms[name])}), {rate:6.1f} GFLOP/s, {100 * rate / peak:4.1f}% of the peak")
    print(f"proposed / library kernel: {med['library kernel'] / med['proposed kernel']:.2f}x faster; "
          f"proposed / PyTorch blocked path: {med['PyTorch blocked path'] / med['proposed kernel']:.2f}x faster "
          f"(native/speed.json's ratio for this choice: PyTorch time / kernel time)")
    diff = max(float(np.abs(finals[a] - finals[b]).max()) for a in finals for b in finals)
    print(f"largest |final loss difference| between the paths over the runs: {diff:.2e} (must be <= 1e-4)")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
