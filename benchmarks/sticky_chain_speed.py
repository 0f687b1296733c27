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

With --profile it also runs a few steps of the fast path (with --other-path, then of the
other path too: where the kernel is chosen, the PyTorch path's ceiling is seen no other
way) under PyTorch's profiler and prints where the time goes: the operators' time per step
(products by their shape), as shares of the time inside operators (the profiler adds its
own time to each, so the table's sum is not the step's time). For the PyTorch path it then
times every matrix product of one step twice: inside a step under the profiler, and made
again on its own on copies of its operands (the fastest of 5, after a warm-up), and takes
the shorter of the two per product. The step's counted work (flop_per_run_step) over that
time is the ceiling: an estimate, from this run's timings, of the most the path could reach
at this block size with these products if the rest of its step took no time. Taking the
shorter time errs toward a high ceiling, as do the replay's warm caches and awake threads;
the machine's speed drifts between runs, so one run's ceiling is one measurement. No
ceiling is printed where the recorder and the profiler disagree on the step's products, in
number, order or any one's GFLOP (one the recorder cannot see would loosen it; one it
records that the profiler does not count as a product would tighten it). It is measured
--repeats times, each beside a measurement of the matmul rate and of a whole step without
the profiler; a repeat whose products took longer than the fastest whole step timed in the
profile was disturbed and gives no ceiling (a coarse check: the products are a share of a
step, so it catches only a slowdown by more than the step's time over theirs). Every share,
the path's own and the ceiling's, is of the highest matmul rate measured in the run (a
lower one was taken to be disturbed). The verdict on a target share (--target, 40% in issue
21) is that the products alone rule it out (every undisturbed repeat below it), do not rule
it out (every one at or above it: not evidence that the path reaches it, whose own share is
printed beside), or that the run does not settle it (repeats on both sides, or fewer than
two undisturbed).

    .venv/bin/python benchmarks/sticky_chain_speed.py            # the whole protocol: 10 runs x 1000 steps
    .venv/bin/python benchmarks/sticky_chain_speed.py --steps 50 # a short check
    .venv/bin/python benchmarks/sticky_chain_speed.py --steps 50 --profile
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

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
    """Floating-point operations (a multiply-add counts 2) this benchmark counts for one
    training step of one run, the rates it prints divide by: the head's products as the model
    writes them, each visible (query, key) pair once. Per pair: the score q.k (2 d_k), the
    read-out alpha Zv (2C), the advantage dz.Zv (2C), dq and dk (4 d_k) and the value
    gradient sum_i alpha dz (2C); plus the projections and their weights' gradients (2 x 2 T
    d_x (2 d_k + d_v): x is data, its gradient is not needed) and the read-out map's three
    products (Zv = V W_O, dV and dW_O: 3 x 2 T d_v C). Not the least any step could do: one
    that multiplied W_V W_O first would need less; the PyTorch path at block 1 (no masked
    pair) makes exactly this plus 2 per pair for the row of ones its advantage product carries
    (tests/test_speed_profile.py)."""
    pairs = T * (T + 1) / 2
    projections = 2 * 2 * T * d_x * (2 * d_k + d_v) + 3 * 2 * T * d_v * C
    return pairs * (6 * d_k + 6 * C) + projections


def matmul_gflops(threads: int, n: int = 1024, repeats: int = 20) -> float:
    """The float32 matmul rate of this machine with the threads set: the best of ``repeats``
    timed products, after 3 untimed ones."""
    return product_gflops((n, n), (n, n), repeats)


def product_gflops(a_shape: tuple[int, ...], b_shape: tuple[int, ...], repeats: int = 20) -> float:
    """The rate of a float32 product (torch.matmul, batched where the shapes have three
    dimensions) of these shapes with the threads set: the best of ``repeats`` timed, after 3
    untimed."""
    a, b = torch.randn(*a_shape), torch.randn(*b_shape)
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            torch.matmul(a, b)
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
    batch = a_shape[0] if len(a_shape) == 3 else 1
    return 2 * batch * a_shape[-2] * a_shape[-1] * b_shape[-1] / best / 1e9


def time_fast(seeds, seq_len, steps, block, native):
    batch = protocol_batch(seeds, seq_len)  # fresh heads: training changes them in place
    params, names = batch.params, batch.names
    loss_fn = causal_head_loss_fn(batch.x, batch.y, block=block, native=native)
    with PeakRSS() as mem:
        start = time.perf_counter()
        hist = train(params, loss_fn, SGD(protocol_rates(names)), steps)
        seconds = time.perf_counter() - start
    return hist.loss[-1], 1000 * seconds / (len(names) * (steps + 1)), seconds, mem.added_mib


PRODUCTS = {"bmm", "mm", "matmul", "addmm", "baddbmm"}  # `@` comes to a mode as matmul


@dataclass
class OpTime:
    """One row of the profile: an operator (a product: by its shape) over the profiled steps."""

    name: str
    ms: float
    calls: int
    gflop: float = 0.0  # products only: the multiply-adds they did, x 2

    @property
    def gflops(self) -> float:
        return self.gflop / (self.ms / 1000) if self.ms > 0 else 0.0


def size_label(d: int, *, block: int, positions: int, head: tuple[int, ...] = ()) -> str:
    """How a profile names a product's size: one of the head's sizes (``head``: d_x, d_k,
    d_v, C, ...) is printed; ``positions`` (T) is "T"; the query block's rows (``block``, or
    the last block's ``positions % block``) are "n"; the keys a block sees (a multiple of
    ``block`` below T) are "b"; any other size is printed. The first block sees n keys and is
    labelled n; where the block's rows equal a head size, :func:`label_clashes` says so."""
    if d in head:
        return str(d)
    if d == positions:
        return "T"
    if d in {block, positions % block}:
        return "n"
    return "b" if d % block == 0 and d < positions else str(d)


def label_clashes(*, block: int, positions: int, head: tuple[int, ...] = ()) -> list[int]:
    """The head's sizes that a block's rows also have: products of those shapes share a label."""
    return sorted({block, positions % block} & set(head))


def product_label(a_shape, b_shape, **sizes) -> str:
    """``(m x k) @ (k x n)`` of a product of (..., m, k) by (..., k, n), sizes named by
    :func:`size_label`."""
    m, k, n = (size_label(d, **sizes) for d in (a_shape[-2], a_shape[-1], b_shape[-1]))
    return f"({m} x {k}) @ ({k} x {n})"


def op_times(events, **sizes) -> list[OpTime]:
    """The profile's operators (``key_averages(group_by_input_shape=True)`` rows: ``key``,
    ``input_shapes``, ``self_cpu_time_total`` in microseconds, ``count``), products grouped by
    :func:`product_label` (bmm and mm: the operands first; addmm and baddbmm: after the added
    term), longest first."""
    rows: dict[str, OpTime] = defaultdict(lambda: OpTime("", 0.0, 0))
    for e in events:
        op = e.key.removeprefix("aten::")
        key = e.key
        if op in PRODUCTS and len(e.input_shapes) >= 2:
            a, b = e.input_shapes[1:3] if op in ("addmm", "baddbmm") else e.input_shapes[:2]
            key = f"{op} {product_label(a, b, **sizes)}"
        row = rows[key]
        row.name, row.ms, row.calls = key, row.ms + e.self_cpu_time_total / 1000, row.calls + e.count
    return sorted(rows.values(), key=lambda r: -r.ms)


@dataclass
class ProductCall:
    """One matrix product a step made: its time there, and copies of its operands (same
    sizes, strides and values) so that it can be made again on its own."""

    name: str
    func: object
    args: tuple
    kwargs: dict
    gflop: float
    step_ms: float = 0.0  # inside the step, as the profiler timed it


def _copy(v):
    if isinstance(v, torch.Tensor):
        c = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype)
        return c.copy_(v)
    return v


class RecordProducts(torch.overrides.TorchFunctionMode):
    """Records every matrix product called through torch (``@``, ``torch.bmm``, ...) inside
    the ``with`` block, as :class:`ProductCall` with its operands copied. Not a timer: the
    mode's Python between a step's operators slows the products it would time."""

    def __init__(self):
        super().__init__()
        self.calls: list[ProductCall] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in PRODUCTS:
            return func(*args, **kwargs)
        copies = tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        a = args[1] if name in ("addmm", "baddbmm") else args[0]
        self.calls.append(ProductCall(name, func, *copies, 2 * out.numel() * a.shape[-1] / 1e9))
        return out


class Unrecorded(ValueError):
    """The recorded products are not the ones the profiler saw the step make."""


def _product(e) -> bool:
    return e.name.removeprefix("aten::") in PRODUCTS


def _outermost(e) -> bool:
    parent = e.cpu_parent
    while parent is not None:
        if _product(parent):
            return False
        parent = parent.cpu_parent
    return True


def _gflop_within(e) -> float:
    """The GFLOP the profiler counts in product event ``e`` and the products it calls (``matmul``
    counts none itself: its ``mm`` or ``bmm`` does)."""
    return (e.flops if _product(e) else 0) / 1e9 + sum(_gflop_within(c) for c in e.cpu_children)


def record_products(fn) -> list[ProductCall]:
    """The matrix products of ``fn()``, each with copies of its operands and its time in the
    step: ``fn()`` runs under PyTorch's profiler (each product's time, the GFLOP it counts)
    and again under :class:`RecordProducts`. Raises :class:`Unrecorded` where the two runs'
    products differ in number, order or the GFLOP of any one: a product the recorder does not
    see (``einsum``, ``F.linear``) would loosen a ceiling, and one it records that the profiler
    does not count as a product (a vector product, a double count) would make it too tight."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        fn()
    timed = [e for e in prof.events() if _product(e) and _outermost(e)]
    with RecordProducts() as rec:
        fn()
    calls = rec.calls
    if len(calls) != len(timed):
        raise Unrecorded(f"the recorder saw {len(calls)} products, the profiler {len(timed)}")
    for i, (c, e) in enumerate(zip(calls, timed)):
        seen = _gflop_within(e)
        if c.name != e.name.removeprefix("aten::"):
            raise Unrecorded(f"product {i + 1} of {len(calls)} is {c.name} to the recorder, {e.name} to the profiler")
        if abs(c.gflop - seen) > 1e-9 * max(seen, 1.0):
            raise Unrecorded(f"product {i + 1} of {len(calls)} ({c.name}): the recorder counted {c.gflop * 1e9:.0f} "
                             f"FLOP where the profiler counted {seen * 1e9:.0f}")
        c.step_ms = event_ms(e)
    return calls


def event_ms(e) -> float:
    """A product event's time with its children's: ``matmul``'s own time is its dispatch, the
    ``mm`` or ``bmm`` it calls does the work (its self time would make the product look free)."""
    return e.cpu_time_total / 1000


def replay_ms(calls: list[ProductCall], repeats: int = 5) -> list[float]:
    """Each call made ``repeats`` more times on its copied operands, on its own, after one
    warm-up: the fastest milliseconds of each. Its copies are freed after (they hold every
    operand of a step)."""
    best = []
    for c in calls:
        c.func(*c.args, **c.kwargs)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            c.func(*c.args, **c.kwargs)
            times.append(time.perf_counter() - start)
        best.append(1000 * min(times))
        c.args, c.kwargs = (), {}
    return best


def products_ceiling(useful_gflop: float, step_ms: list[float], alone_ms: list[float]) -> tuple[float, float]:
    """The products' milliseconds (each the shorter of its time in the step and on its own)
    and the GFLOP/s of ``useful_gflop`` done in that time: an estimate, from these timings, of
    the most a step that makes these products could reach if the rest of it took no time."""
    ms = sum(min(a, b) for a, b in zip(step_ms, alone_ms, strict=True))
    return ms, useful_gflop / (ms / 1000) if ms > 0 else float("inf")


LEAST_REPEATS = 2  # one measurement cannot show that repeats agree


def side_of(shares: list[float], target: float) -> str:
    """What repeated measurements of a products-only ceiling's share say of ``target``: the
    products alone "rule out" reaching it where every one is below it, "do not rule out" where
    every one is at or above it (which is not evidence the path reaches it: the rest of a
    step takes time too), and "do not settle" where they disagree or fewer than
    LEAST_REPEATS were made."""
    if len(shares) >= LEAST_REPEATS and all(x < target for x in shares):
        return "rule out"
    if len(shares) >= LEAST_REPEATS and all(x >= target for x in shares):
        return "do not rule out"
    return "do not settle"


def whole_step_ms(params, loss_fn, rule, steps: int) -> float:
    """Milliseconds per training step (of every run in ``params``) over ``steps`` steps."""
    start = time.perf_counter()
    train(params, loss_fn, rule, steps - 1)  # train() makes steps + 1 evaluations
    return 1000 * (time.perf_counter() - start) / steps


def profile_fast(seeds, seq_len, steps, block, native, *, repeats=3, target=0.40, peaks=None) -> dict:
    """Print where ``steps`` steps of a path (``native``: the kernel's) spend their time and, for the PyTorch
    path, the ceiling its products set, ``repeats`` times (see the module's text). ``peaks``:
    the matmul rates measured so far in this run; each repeat's is added to it. Returns the
    ceilings in GFLOP/s (``ceilings``) and as shares of the highest peak (``shares``), the
    repeats whose products took longer than the fastest whole step without the profiler
    (``disturbed``: no ceiling), and ``peaks``."""
    from torch.profiler import ProfilerActivity, profile

    batch = protocol_batch(seeds, seq_len)
    loss_fn = causal_head_loss_fn(batch.x, batch.y, block=block, native=native)
    rule = SGD(protocol_rates(batch.names))
    sizes = dict(block=block, positions=seq_len - 1, head=(sc.D_X, D_K, D_V, sc.N_STATES, sc.N_STATES + 1))
    train(batch.params, loss_fn, rule, 2)  # first calls (allocations, a kernel's load) not timed
    plain_ms = whole_step_ms(batch.params, loss_fn, rule, steps)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        train(batch.params, loss_fn, rule, steps - 1)
    rows = op_times(prof.key_averages(group_by_input_shape=True), **sizes)
    in_ops = sum(r.ms for r in rows) / steps
    path = "the compiled kernel" if native else "the PyTorch blocked path"
    print(f"profile of {steps} steps of {path} (block {block}), ms per step of all "
          f"{len(batch.names)} runs: {plain_ms:.1f} without the profiler; under it, {in_ops:.1f} inside PyTorch "
          f"operators (the profiler adds its own time to each)")
    for d in label_clashes(**sizes):
        print(f"  (a block's rows number {d}, as a size of the head does: products of both print as {d})")
    print(f"  {'operator (n: a block of queries, b: the keys it sees, T: all positions)':62s} "
          f"{'ms/step':>8s} {'of ops':>6s} {'calls/step':>10s}")
    for r in rows[:14]:
        print(f"  {r.name:62s} {r.ms / steps:8.2f} {100 * r.ms / steps / in_ops:5.1f}% {r.calls / steps:10.0f}")
    rest = sum(r.ms for r in rows[14:]) / steps
    print(f"  {f'{len(rows) - 14} other operators':62s} {rest:8.2f} {100 * rest / in_ops:5.1f}%")
    peaks = [] if peaks is None else peaks
    result = dict(ceilings=[], shares=[], disturbed=[], peaks=peaks)
    if native:
        print("  the compiled kernel makes each block's products itself: no ceiling from PyTorch's products")
        return result
    useful = flop_per_run_step(seq_len - 1, sc.D_X, D_K, D_V, sc.N_STATES) * len(batch.names) / 1e9
    ceilings = result["ceilings"]
    for i in range(repeats):
        # a whole step beside each repeat: the fastest of them bounds what its products can take
        plain_ms = min(plain_ms, whole_step_ms(batch.params, loss_fn, rule, steps))
        peak = matmul_gflops(torch.get_num_threads())
        try:
            calls = record_products(lambda: loss_fn(batch.params))
        except Unrecorded as e:
            print(f"  {e}: no ceiling")
            return result
        recorded = sum(c.gflop for c in calls)
        names = [f"{c.name} {product_label(c.args[-2].shape, c.args[-1].shape, **sizes)}" for c in calls]
        step_ms = [c.step_ms for c in calls]
        alone = replay_ms(calls)
        ms, ceiling = products_ceiling(useful, step_ms, alone)
        peaks.append(peak)
        # the products are part of a step: longer than a whole step (timed without the profiler)
        # they were slowed by something else on the machine, and their ceiling means nothing.
        # A coarse check: the products are a share of a step, so it catches only a slowdown by
        # more than the step's time over theirs
        disturbed = ms > plain_ms
        if disturbed:
            result["disturbed"].append(i + 1)
        else:
            ceilings.append(ceiling)
        print(f"  repeat {i + 1}: the step's {len(calls)} products ({recorded:.2f} GFLOP, as the profiler counts them) "
              f"take {sum(step_ms):.1f} ms in a step under the profiler, {sum(alone):.1f} ms on their own, {ms:.1f} ms the shorter of "
              f"each; the step's counted work ({useful:.2f} GFLOP) in that time is {ceiling:.1f} GFLOP/s; the matmul "
              f"beside it: {peak:.1f} GFLOP/s"
              + (f"; DISTURBED: longer than the fastest whole step ({plain_ms:.1f} ms), no ceiling" if disturbed else ""))
    by_shape: dict[str, OpTime] = defaultdict(lambda: OpTime("", 0.0, 0))
    for name, c, a, b in zip(names, calls, step_ms, alone):
        row = by_shape[name]
        row.name, row.ms, row.calls, row.gflop = name, row.ms + min(a, b), row.calls + 1, row.gflop + c.gflop
    print("  the last repeat's products by shape (each the shorter of its time in the step and on its own):")
    for r in sorted(by_shape.values(), key=lambda r: -r.ms)[:8]:
        print(f"    {r.name:60s} {r.ms:8.2f} ms {r.calls:4d} calls {r.gflops:7.1f} GFLOP/s")
    # the peak is the most the machine did: a lower measurement was disturbed, and dividing by it
    # would raise that repeat's share
    result["shares"] = shares = [c / max(peaks) for c in ceilings]
    side = side_of(shares, target)
    own = useful / (plain_ms / 1000)
    verdict = {"rule out": f"the products alone rule out {100 * target:.0f}% of it",
               "do not rule out": f"the products alone do not rule out {100 * target:.0f}% of it (which is not "
                                  f"the path reaching it)",
               "do not settle": f"this run does not settle whether the products alone rule out "
                                f"{100 * target:.0f}% of it ({len(shares)} undisturbed repeats: at least "
                                f"{LEAST_REPEATS}, all on one side, are needed)"}[side]
    print(f"  ceiling, in {repeats} repeats ({len(shares)} undisturbed): "
          f"{', '.join(f'{100 * x:.1f}%' for x in shares) or 'none'} of the matmul peak "
          f"(the highest of {', '.join(f'{x:.1f}' for x in peaks)} GFLOP/s, every measurement in this run): "
          f"{verdict}. An estimate from this run's timings of the most a step at block {block} that makes "
          f"these products could reach if the rest of it took no time; the path itself, its fastest whole "
          f"step here: {own:.1f} GFLOP/s, {100 * own / max(peaks):.1f}% of the peak")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps per run (protocol: 1000)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(sc.SEEDS), help="seeds (protocol: the five of the paper)")
    ap.add_argument("--seq-len", type=int, default=2000, help="states per sequence (protocol: 2000)")
    ap.add_argument("--block", type=int, default=64, help="query rows per block of the PyTorch path")
    ap.add_argument("--other-path", action="store_true",
                    help="also time the path not chosen here (the kernel or the PyTorch blocked path)")
    ap.add_argument("--profile", action="store_true",
                    help="also print where the fast path's time goes (with --other-path, the other path's too)")
    ap.add_argument("--profile-steps", type=int, default=20, help="steps profiled with --profile")
    ap.add_argument("--repeats", type=int, default=3, help="measurements of the ceiling with --profile")
    ap.add_argument("--target", type=float, default=0.40,
                    help="share of the matmul peak the ceiling is compared with (issue 21: 0.40)")
    args = ap.parse_args()
    if min(args.steps, args.block, args.profile_steps, args.repeats) < 1 or args.seq_len < 2:
        ap.error("--steps, --profile-steps, --repeats and --block must be >= 1 and --seq-len >= 2")
    if not 0 < args.target <= 1:
        ap.error(f"--target must be a share of the peak in (0, 1], got {args.target}")

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
    peaks = [matmul_gflops(threads)]
    rate = flop / (fast_ms / 1000) / 1e9
    print(f"CPU: {cpu_model()}, {threads} threads")
    print(f"speed ratio naive / fast: {naive_ms / fast_ms:.1f}x")
    if args.other_path and builds:
        kernel_ms, torch_ms = (fast_ms, o_ms) if native else (o_ms, fast_ms)
        print(f"speed ratio PyTorch blocked path / compiled kernel (as in native/speed.json): "
              f"{torch_ms / kernel_ms:.2f}x; the {names_of[native]} is chosen here")
    if args.profile:
        # with --other-path the path not chosen is profiled too: where the kernel is chosen, that
        # is the only way to see the PyTorch path's ceiling
        for path in [native] + ([not native] if args.other_path and builds else []):
            profile_fast(seeds, args.seq_len, args.profile_steps, args.block, path, repeats=args.repeats,
                         target=args.target, peaks=peaks)
    # the path's share against the same peak as the ceiling's: the highest rate measured in this run
    print(f"fast path: {flop / 1e6:.0f} MFLOP of counted work per run-step, {rate:.1f} GFLOP/s; "
          f"float32 matmul (1024^3) on this machine: {max(peaks):.1f} GFLOP/s, the highest of "
          f"{len(peaks)} measured in this run ({100 * rate / max(peaks):.0f}% of it)")
    diff = max(float(np.abs(np.array(naive_final) - f).max()) for f in finals.values())
    print(f"largest |final loss naive - fast| over the {runs} runs: {diff:.2e} (must be <= 1e-4)")
    for name, a, b in zip(names, naive_final, np.asarray(fast_final)):
        print(f"  {name:8s} naive {a:.6f}  fast {b:.6f}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
