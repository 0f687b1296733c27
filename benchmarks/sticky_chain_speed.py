#!/usr/bin/env python
"""Speed of the sticky-chain protocol (R7): the fast path against a faithful naive one.

Both run in this one process, on the same seeds and initial weights:

- naive: the way the authors' script works: one run at a time, autograd, the full T x T
  masked softmax (attention_dynamics.causal_head.train_reference);
- fast: all runs batched, the closed-form backward of R1-R3, so that the T x T matrix
  never exists, by the path the library takes on this processor (attention_dynamics.native's
  choice, from native/speed.json): each query's forward and backward pass fused in a
  compiled kernel, or the pure-PyTorch blocked path (also where no C compiler is found;
  ATTENTION_DYNAMICS_NATIVE=0 or =1 forces one); --other-path times the other one as a
  third contender. On an AMD EPYC with AVX2 (family 25 model 1) the kernel is the slower
  of the two (2026-12-02): a benchmark that always timed the kernel called it the fast path.

Prints milliseconds per run-step, their ratio, the peak resident memory each phase added,
the fast path's arithmetic rate against a float32 matmul measured on this machine with the
same threads, and the largest difference between the paths' final losses (must be <= 1e-4;
the script exits 1 otherwise). A benchmark, not a test: timings depend on the machine.

    .venv/bin/python benchmarks/sticky_chain_speed.py            # the whole protocol: 10 runs x 1000 steps
    .venv/bin/python benchmarks/sticky_chain_speed.py --steps 50 # a short check
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import torch

from attention_dynamics.causal_head import (D_K, D_V, causal_head_loss_fn, protocol_batch, protocol_rates,
                                            train_reference)
from attention_dynamics.machine import cpu_model
from attention_dynamics.native import NativeUnavailable, causal_head_kernel, choice_reason, chooses
from attention_dynamics.tasks import sticky_chain as sc
from attention_dynamics.training import SGD, train


class PeakRSS:
    """Highest resident set size seen (sampled every 2 ms) above the level at entry."""

    def __enter__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _watch(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())

    @property
    def added_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def flop_per_run_step(T: int, d_x: int, d_k: int, d_v: int, C: int) -> float:
    """Floating-point operations (a multiply-add counts 2) that one training step of one run
    needs at the least: per visible (query, key) pair, the score q.k (2 d_k), the read-out
    alpha Zv (2C), the advantage dz.Zv (2C), dq and dk (4 d_k) and the value gradient
    sum_i alpha dz (2C); plus the projections and their gradients (3 x 2 T d_x (2 d_k + d_v)
    and the read-out map)."""
    pairs = T * (T + 1) / 2
    projections = 3 * 2 * T * d_x * (2 * d_k + d_v) + 3 * 2 * T * d_v * C
    return pairs * (6 * d_k + 6 * C) + projections


def matmul_gflops(threads: int, n: int = 1024, repeats: int = 20) -> float:
    """The float32 matmul rate of this machine, the best of ``repeats``, with ``threads``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats + 3):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def time_fast(seeds, seq_len, steps, block, native):
    batch = protocol_batch(seeds, seq_len)  # fresh heads: training changes them in place
    params, names = batch.params, batch.names
    loss_fn = causal_head_loss_fn(batch.x, batch.y, block=block, native=native)
    with PeakRSS() as mem:
        start = time.perf_counter()
        hist = train(params, loss_fn, SGD(protocol_rates(names)), steps)
        seconds = time.perf_counter() - start
    return hist.loss[-1], 1000 * seconds / (len(names) * (steps + 1)), seconds, mem.added_mib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps per run (protocol: 1000)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(sc.SEEDS), help="seeds (protocol: the five of the paper)")
    ap.add_argument("--seq-len", type=int, default=2000, help="states per sequence (protocol: 2000)")
    ap.add_argument("--block", type=int, default=64, help="query rows per block of the PyTorch path")
    ap.add_argument("--other-path", action="store_true",
                    help="also time the path not chosen here (the kernel or the PyTorch blocked path)")
    args = ap.parse_args()
    if args.steps < 1 or args.seq_len < 2 or args.block < 1:
        ap.error("--steps and --block must be >= 1 and --seq-len >= 2")

    torch.set_num_threads(torch.get_num_threads())
    seeds = args.seeds
    batch = protocol_batch(seeds, args.seq_len)
    seq, names = batch.sequences, batch.names
    runs = len(names)
    print(f"{runs} runs x {args.steps} steps, T = {args.seq_len - 1} positions, {torch.get_num_threads()} threads")
    try:
        causal_head_kernel(D_K, sc.N_STATES)
        builds, why = True, choice_reason("causal_head")[1]
    except NativeUnavailable as e:
        builds, why = False, f"no compiled kernel: {e}"
    native = builds and chooses("causal_head")
    print(f"the path chosen here: {'the compiled kernel' if native else 'PyTorch'} ({why})")
    if args.other_path and not builds:
        print("--other-path: no kernel to time beside PyTorch")
    names_of = {True: "compiled kernel", False: "PyTorch blocked path"}
    fast_final, fast_ms, fast_s, fast_mib = time_fast(seeds, args.seq_len, args.steps, args.block, native)
    label = f"fast ({names_of[native]})"
    print(f"{label:28s}: {fast_s:8.1f} s  {fast_ms:7.2f} ms per run-step  peak memory +{fast_mib:7.1f} MiB")
    finals = {label: fast_final}
    if args.other_path and builds:
        o_final, o_ms, o_s, o_mib = time_fast(seeds, args.seq_len, args.steps, args.block, not native)
        print(f"{names_of[not native]:28s}: {o_s:8.1f} s  {o_ms:7.2f} ms per run-step  peak memory +{o_mib:7.1f} MiB")
        finals[names_of[not native]] = o_final

    naive_final = []
    with PeakRSS() as mem_naive:
        start = time.perf_counter()
        for i, name in enumerate(names):
            losses = train_reference(seeds[i % len(seeds)], seq.x[i % len(seeds)], seq.y[i % len(seeds)], name, args.steps)
            naive_final.append(losses[-1])
            print(f"  naive run {i + 1}/{runs} ({name}, seed {seeds[i % len(seeds)]}): final loss {losses[-1]:.6f}", flush=True)
        naive_s = time.perf_counter() - start
    naive_ms = 1000 * naive_s / (runs * (args.steps + 1))
    print(f"naive: {naive_s:8.1f} s   {naive_ms:7.2f} ms per run-step   peak memory +{mem_naive.added_mib:7.1f} MiB")

    threads = torch.get_num_threads()
    flop = flop_per_run_step(args.seq_len - 1, sc.D_X, D_K, D_V, sc.N_STATES)
    peak = matmul_gflops(threads)
    rate = flop / (fast_ms / 1000) / 1e9
    print(f"CPU: {cpu_model()}, {threads} threads")
    print(f"speed ratio naive / fast: {naive_ms / fast_ms:.1f}x")
    if args.other_path and builds:
        kernel_ms, torch_ms = (fast_ms, o_ms) if native else (o_ms, fast_ms)
        print(f"speed ratio PyTorch blocked path / compiled kernel (as in native/speed.json): "
              f"{torch_ms / kernel_ms:.2f}x; the {names_of[native]} is chosen here")
    print(f"fast path: {flop / 1e6:.0f} MFLOP per run-step at least, {rate:.1f} GFLOP/s; "
          f"float32 matmul (1024^3) on this machine: {peak:.1f} GFLOP/s ({100 * rate / peak:.0f}% of it)")
    diff = max(float(np.abs(np.array(naive_final) - f).max()) for f in finals.values())
    print(f"largest |final loss naive - fast| over the {runs} runs: {diff:.2e} (must be <= 1e-4)")
    for name, a, b in zip(names, naive_final, np.asarray(fast_final)):
        print(f"  {name:8s} naive {a:.6f}  fast {b:.6f}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
