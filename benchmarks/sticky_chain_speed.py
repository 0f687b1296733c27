#!/usr/bin/env python
"""Speed of the sticky-chain protocol (R7): the fast path against a faithful naive one.

Both run in this one process, on the same seeds and initial weights:

- naive: the way the authors' script works: one run at a time, autograd, the full T x T
  masked softmax (attention_dynamics.causal_head.train_reference);
- fast: all runs batched, the closed-form backward of R1-R3, causal attention walked in
  row blocks so the T x T matrix never exists (attention_dynamics.causal_head).

Prints milliseconds per run-step, their ratio, the peak resident memory each phase added,
and the largest difference between the two paths' final losses (must be <= 1e-4; the
script exits 1 otherwise). A benchmark, not a test: timings depend on the machine.

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

from attention_dynamics.causal_head import causal_head_loss_fn, init_heads, protocol_rates, train_reference
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps per run (protocol: 1000)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(sc.SEEDS), help="seeds (protocol: the five of the paper)")
    ap.add_argument("--seq-len", type=int, default=2000, help="states per sequence (protocol: 2000)")
    ap.add_argument("--block", type=int, default=64, help="query rows per block of the fast path")
    args = ap.parse_args()
    if args.steps < 1 or args.seq_len < 2 or args.block < 1:
        ap.error("--steps and --block must be >= 1 and --seq-len >= 2")

    torch.set_num_threads(torch.get_num_threads())
    seeds = args.seeds
    seq = sc.sample_sequences(seeds, n_states_seq=args.seq_len)
    names = ["SGD"] * len(seeds) + ["EM-style"] * len(seeds)
    runs = len(names)
    print(f"{runs} runs x {args.steps} steps, T = {args.seq_len - 1} positions, {torch.get_num_threads()} threads")

    x = torch.cat([seq.x, seq.x])
    y = torch.cat([seq.y, seq.y])
    params = init_heads(seeds + seeds)
    with PeakRSS() as mem_fast:
        start = time.perf_counter()
        hist = train(params, causal_head_loss_fn(x, y, block=args.block), SGD(protocol_rates(names)), args.steps)
        fast_s = time.perf_counter() - start
    fast_final = hist.loss[-1]
    fast_ms = 1000 * fast_s / (runs * (args.steps + 1))
    print(f"fast : {fast_s:8.1f} s   {fast_ms:7.2f} ms per run-step   peak memory +{mem_fast.added_mib:7.1f} MiB")

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

    diff = float(np.abs(np.array(naive_final) - fast_final).max())
    print(f"speed ratio naive / fast: {naive_ms / fast_ms:.1f}x")
    print(f"largest |final loss naive - fast| over the {runs} runs: {diff:.2e} (must be <= 1e-4)")
    for name, a, b in zip(names, naive_final, fast_final):
        print(f"  {name:8s} naive {a:.6f}  fast {b:.6f}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
