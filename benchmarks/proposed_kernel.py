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
(tests/test_sticky_chain.py and tests/test_transformer.py run the library kernels' bound
checks on the proposed sources through it, with bugs planted in them as negative controls).

This script measures, in one process, the library's kernels, the proposed ones and the
PyTorch paths side by side, every repeat in an order that rotates (so that a drift of the
machine falls on all three), for every kernel a patch changes:

- benchmarks/kernel_choice.py's measurement (one thread, forward and backward, at the sizes
  the book runs the kernel): the medians, PyTorch time / kernel time, and the choice each
  kernel would get by attention_dynamics.native.MARGIN;
- for the causal head, the sticky-chain protocol's training (sticky_chain_speed's loop: all
  runs batched, SGD, the closed-form backward; --steps, with the threads set): milliseconds
  per run-step, each path's rate of counted work (sticky_chain_speed.flop_per_run_step)
  against a float32 matmul measured before and after with the same threads (the higher), and
  the largest difference of the paths' final losses (must be <= 1e-4, as in
  sticky_chain_speed; the script exits 1 otherwise);
- for causal attention, whole training steps of the deep variant (deep_variant_speed's
  serial loop, one thread; --deep-steps per repeat), milliseconds per seed-step.

Every contender gets the same untimed call right before each timed one, the proposed kernel
is loaded before a timer starts, and the files each kernel was loaded from are printed.

A benchmark, not a test: timings depend on the machine.

    .venv/bin/python benchmarks/proposed_kernel.py                 # 100 steps, 3 repeats, 2 deep steps
    .venv/bin/python benchmarks/proposed_kernel.py --steps 20 --repeats 2 --deep-steps 1
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
if str(HERE) not in sys.path:  # run from anywhere, or loaded by path from a test
    sys.path.insert(0, str(HERE))

import attention_dynamics.native as native  # noqa: E402
from attention_dynamics.causal_head import D_K, D_V  # noqa: E402
from attention_dynamics.native import causal_head_kernel  # noqa: E402
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
    for name in touched(patches):
        if (folder / f"{name}.c").read_bytes() == (native.HERE / f"{name}.c").read_bytes():
            raise RuntimeError(f"the patches in {patches} leave {name}.c as it is")
    return folder


@contextlib.contextmanager
def built_from(folder: Path):
    """Inside the block the library builds and loads its kernels from ``folder`` (none of
    those loaded before is used); outside, from its own sources again."""
    with (mock.patch.object(native, "HERE", folder), mock.patch.dict(native._loaded, {}, clear=True),
          mock.patch.dict(native._targets)):
        yield


def loaded(name: str) -> str:
    """The file kernel ``name`` was loaded from in this process (inside or outside
    :func:`built_from`) and the target it was built for: what a contender really ran."""
    libs = [lib for (source, _), lib in native._loaded.items() if source == f"{name}.c" and not isinstance(lib, Exception)]
    return f"{', '.join(Path(lib._name).name for lib in libs) or 'none'} ({native._targets.get(name, '?')})"


def touched(patches: Path = PATCHES) -> list[str]:
    """The kernels (native/<name>.c) the patches in ``patches`` change, in KERNELS' order."""
    names = {line[len("+++ b/"):].split()[0].removesuffix(".c") for f in patches.glob("*.patch")
             for line in f.read_text().splitlines() if line.startswith("+++ b/")}
    return [n for n in native.KERNELS if n in names]


def rotated(names: list[str], rep: int) -> list[str]:
    """``names`` starting at the rep-th: each contender first in turn, so a drift falls on all."""
    k = rep % len(names)
    return names[k:] + names[:k]


def choice_at_the_books_sizes(name: str, folder: Path, repeats: int) -> None:
    """benchmarks/kernel_choice.py's measurement of kernel ``name`` (one thread, forward and
    backward, at the sizes the book runs it), with the proposed kernel as a third contender
    in every repeat; prints the medians, the ratios and the choice each kernel would get."""
    from kernel_choice import CASES, seconds

    torch.set_num_threads(1)
    ratios = {"library kernel": [], "proposed kernel": []}
    for label, make in CASES[name].items():
        fn = make()

        def warm_then_timed(compiled):
            fn(compiled)  # every contender: one untimed call right before its timed one
            return seconds(fn, compiled)

        def proposed():
            with built_from(folder):  # the untimed call also loads the proposed kernel again
                return warm_then_timed(True)

        contenders = {"library kernel": lambda: warm_then_timed(True), "proposed kernel": proposed,
                      "PyTorch": lambda: warm_then_timed(False)}
        times = {c: [] for c in contenders}
        for rep in range(repeats):
            for c in rotated(list(contenders), rep):
                times[c].append(contenders[c]())
        if label == next(iter(CASES[name])):
            with built_from(folder):
                fn(True)
                ran = loaded(name)
            print(f"  {name}: library kernel from {loaded(name)}, proposed from {ran}")
        med = {c: 1e3 * statistics.median(v) for c, v in times.items()}
        for c in ratios:
            ratios[c].append(med["PyTorch"] / med[c])
        print(f"  {name:17s} {label:50s} library kernel {med['library kernel']:8.2f} ms  proposed "
              f"{med['proposed kernel']:8.2f} ms  PyTorch {med['PyTorch']:8.2f} ms   PyTorch / proposed "
              f"{med['PyTorch'] / med['proposed kernel']:5.2f}x (library kernel {med['PyTorch'] / med['library kernel']:5.2f}x)")
    for c, r in ratios.items():
        print(f"  -> {name}, {c}: smallest ratio {min(r):.2f}x over the book's sizes, margin {native.MARGIN}: "
              f"{'the kernel' if min(r) >= native.MARGIN else 'PyTorch'} would be chosen")


def sticky_chain_training(folder: Path, steps: int, repeats: int, seeds: list[int], seq_len: int) -> float:
    """The protocol's training through the library's kernel, the proposed one and the PyTorch
    blocked path, with the threads set; prints the medians, rates and ratios; returns the
    largest difference of the paths' final losses."""
    from sticky_chain_speed import flop_per_run_step, matmul_gflops, time_fast

    threads = torch.get_num_threads()
    peaks = [matmul_gflops(threads)]
    paths = {"library kernel": (contextlib.nullcontext, True),
             "proposed kernel": (lambda: built_from(folder), True),
             "PyTorch blocked path": (contextlib.nullcontext, False)}
    ms = {name: [] for name in paths}
    finals = {}
    print(f"sticky-chain protocol: {2 * len(seeds)} runs x {steps} steps, T = {seq_len - 1} positions, {threads} threads")
    for rep in range(repeats):
        for name in rotated(list(paths), rep):
            context, kernel = paths[name]
            with context():
                if kernel:  # loaded (built_from empties the loaded kernels) before the timer starts
                    causal_head_kernel(D_K, sc.N_STATES)
                final, step_ms, _, _ = time_fast(seeds, seq_len, steps, 64, kernel)
            ms[name].append(step_ms)
            finals[name] = np.asarray(final)
            print(f"  repeat {rep + 1}: {name:22s} {step_ms:7.2f} ms per run-step", flush=True)
    peaks.append(matmul_gflops(threads))
    peak = max(peaks)
    flop = flop_per_run_step(seq_len - 1, sc.D_X, D_K, D_V, sc.N_STATES)
    print(f"  float32 matmul (1024^3), {threads} threads: {peak:.1f} GFLOP/s "
          f"(the higher of {', '.join(f'{p:.1f}' for p in peaks)}, before and after)")
    med = {name: statistics.median(v) for name, v in ms.items()}
    for name, m in med.items():
        rate = flop / (m / 1000) / 1e9
        print(f"  {name:22s}: median {m:7.2f} ms per run-step (of {len(ms[name])}: "
              f"{', '.join(f'{v:.2f}' for v in ms[name])}), {rate:6.1f} GFLOP/s, {100 * rate / peak:4.1f}% of the peak")
    print(f"  proposed / library kernel: {med['library kernel'] / med['proposed kernel']:.2f}x faster; "
          f"proposed / PyTorch blocked path: {med['PyTorch blocked path'] / med['proposed kernel']:.2f}x faster")
    diff = max(float(np.abs(finals[a] - finals[b]).max()) for a in finals for b in finals)
    print(f"  largest |final loss difference| between the paths over the runs: {diff:.2e} (must be <= 1e-4)")
    return diff


def deep_variant_steps(folder: Path, steps: int, repeats: int) -> None:
    """Whole training steps of the deep variant (benchmarks/deep_variant_speed.py's serial
    loop: five seeds, AdamW, a warm-up step before the timed ones), one thread, every
    attention call through the library's kernel, the proposed one and PyTorch's SDPA,
    ``repeats`` times in an order that rotates; prints the medians."""
    from deep_variant_speed import T, attention_through, serial

    torch.set_num_threads(1)
    x, y = torch.randn(5, 1, T, 20), torch.randint(0, 8, (5, 1, T))

    def through(compiled, context=contextlib.nullcontext):
        def run():
            with context(), attention_through(compiled):
                return serial(x, y, steps)
        return run

    contenders = {"library kernel": through(True), "proposed kernel": through(True, lambda: built_from(folder)),
                  "PyTorch SDPA": through(False)}
    times = {c: [] for c in contenders}
    for rep in range(repeats):
        for c in rotated(list(contenders), rep):
            times[c].append(contenders[c]())
    med = {c: statistics.median(v) for c, v in times.items()}
    for name, v in med.items():
        print(f"  deep variant, {name:16s}: median {1000 * v:7.1f} ms per seed-step (of {len(times[name])}: "
              f"{', '.join(f'{1000 * t:.1f}' for t in times[name])}), 1 thread ({med['PyTorch SDPA'] / v:.2f}x SDPA)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100,
                    help="sticky-chain training steps per run and repeat, 0 for none (default 100)")
    ap.add_argument("--repeats", type=int, default=3, help="timings of each contender (default 3)")
    ap.add_argument("--deep-steps", type=int, default=2,
                    help="timed deep-variant steps per contender, 0 for none (default 2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(sc.SEEDS), help="seeds (protocol: the five of the paper)")
    ap.add_argument("--seq-len", type=int, default=2000, help="states per sequence (protocol: 2000)")
    args = ap.parse_args()
    if args.repeats < 1 or min(args.steps, args.deep_steps) < 0 or args.seq_len < 2:
        ap.error("--repeats must be >= 1, --steps and --deep-steps >= 0 and --seq-len >= 2")
    kernels = touched()
    if not kernels:
        ap.error(f"no patch of a kernel in {PATCHES}")
    threads = torch.get_num_threads()
    print(f"CPU: {cpu_model()}; proposed: {', '.join(sorted(p.name for p in PATCHES.glob('*.patch')))}")
    diff = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        folder = proposed_sources(Path(tmp) / "native")
        print(f"at the book's sizes, 1 thread, median of {args.repeats} (benchmarks/kernel_choice.py's cases):")
        for name in kernels:
            choice_at_the_books_sizes(name, folder, args.repeats)
        torch.set_num_threads(threads)
        if "causal_head" in kernels and args.steps:
            diff = sticky_chain_training(folder, args.steps, args.repeats, args.seeds, args.seq_len)
        if "causal_attention" in kernels and args.deep_steps:
            deep_variant_steps(folder, args.deep_steps, args.repeats)
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
