"""Speed of a wind-tunnel run at the paper profile's settings (notebooks/profiles.yml:
V = 8, L = 7, 15 positions; a 2-layer transformer 64 wide with 4 heads; batch 128), the largest
share of the paper build: the main runs of all four wind-tunnel chapters, the ablations and
every run of the fair comparison are of this size (the calibration chapter's larger alphabet
is not). Milliseconds per training step of the loop the main runs and the ablations train
with (WindTunnelConfig.train: a fresh batch, the forward and backward pass, AdamW; a run of
n steps evaluates n + 1 gradients, as its loss curve counts them, and a step here is one of
them; the fair comparison's loop, windtunnel_rates.train_run, makes the same step and adds
held-out evaluations, not timed here), one thread, through each attention path: the compiled
causal attention and PyTorch's fused scaled_dot_product_attention, measured in pairs whose
order alternates, so that a drift of the machine falls on both. The ratio of each pair is
printed, and their median.

Each path's rate is the step's counted work over its time, against a float32 matmul
(1024^3) measured in this run with the same thread (the higher of a measurement before and
one after the contenders). The counted work is PyTorch's flop counter over the loop itself
with attention written as plain products, the masked (query, key) pairs taken out
(deep_variant_speed.attention_in_plain_products): the model's products, not the sampling,
softmax, GELU, layer norms or AdamW; tests/test_speed_profile.py pins it to the model's
products. Both paths make more than is counted (each computes the scores again in its
backward pass; the kernel pads the 15 keys to 16), a share of attention's 2%. Beside the
peak, the rates of products of the model's own shapes.

With --profile, where a step's time goes: PyTorch's profiler over --profile-steps steps of
the PyTorch path (the compiled kernel's calls are not operators it can name), the
operators' self time summed into the products, attention, GELU, the layer norms, AdamW (its
step's whole time) and the rest (the batch's sampling, the embedding, the loss, residual
additions, copies and transposes, zeroing the gradients, the learning-rate schedule, the
loop's finiteness checks, the autograd engine's own time), as shares of the profiled time.
The profiler adds its own time to every operator, most to the many small ones in the rest;
the profiled time per step is printed beside the unprofiled one.

A benchmark, not a test: timings depend on the machine; the ratios are what count.

    .venv/bin/python benchmarks/wind_tunnel_speed.py
    .venv/bin/python benchmarks/wind_tunnel_speed.py --steps 300 --repeats 5 --profile
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

import attention_dynamics.native as native
import attention_dynamics.transformer as tr
from attention_dynamics.book.profiles import load_profiles
from attention_dynamics.machine import cpu_model
from attention_dynamics.windtunnel import WindTunnelConfig

from deep_variant_speed import attention_in_plain_products, attention_through, own_shapes  # noqa: E402
from sticky_chain_speed import matmul_gflops, product_gflops  # noqa: E402  (this folder is sys.path[0])

ROOT = Path(__file__).resolve().parents[1]
PATHS = {True: "compiled attention", False: "PyTorch SDPA"}


def paper_settings() -> WindTunnelConfig:
    """The wind tunnel of the paper profile, the same in all four chapters (checked)."""
    profiles = load_profiles(ROOT)
    found = {n: p["paper"]["wind_tunnel"] for n, p in profiles.items() if "wind_tunnel" in p["paper"]}
    configs = {n: WindTunnelConfig.from_dict({k: v for k, v in s.items() if k != "eval_size"}) for n, s in found.items()}
    if len(set(configs.values())) != 1:
        raise RuntimeError(f"the chapters' paper wind tunnels differ: {configs}")
    return next(iter(configs.values()))


def counted_flop(cfg: WindTunnelConfig) -> dict[str, float]:
    """FLOP per gradient of the training loop, by PyTorch's flop counter: "attention" (the
    scores and the read-out, each visible pair once) and "dense" (every linear map)."""
    from torch.utils.flop_counter import FlopCounterMode

    one = dataclasses.replace(cfg, n_steps=10)
    model, T = one.model(), one.task.length
    # the loop itself, counted over a short run: what it runs, not a copy of it
    with mock.patch.object(tr, "causal_attention", attention_in_plain_products), \
            FlopCounterMode(display=False) as counter:
        gradients = len(one.train(model, every=one.n_steps, progress=False).loss)
    counts = {str(op): v / gradients for op, v in counter.get_flop_counts()["Global"].items()}
    attention = counts.pop("aten.bmm") * (T + 1) / (2 * T)
    if set(counts) - {"aten.addmm", "aten.mm"}:
        raise RuntimeError(f"products the count does not expect: {sorted(counts)}")
    return {"attention": attention, "dense": sum(counts.values())}


def ms_per_step(cfg: WindTunnelConfig, steps: int, compiled: bool) -> float:
    """The loop's time per gradient over a run of ``steps`` steps of a fresh model, after an
    untimed run of 10 (the kernel's build, the allocator's first requests)."""
    with attention_through(compiled):
        warm = dataclasses.replace(cfg, n_steps=10)
        warm.train(warm.model(), every=10, progress=False)
        run = dataclasses.replace(cfg, n_steps=steps)
        model = run.model()
        start = time.perf_counter()
        gradients = len(run.train(model, every=steps, progress=False).loss)
        return 1000 * (time.perf_counter() - start) / gradients


GROUPS = {"products": ("aten::mm", "aten::addmm", "aten::bmm"), "attention": ("scaled_dot_product",),
          "GELU": ("gelu",), "layer norms": ("layer_norm",)}
OPTIMIZER = "Optimizer.step#AdamW.step"  # the record_function PyTorch's optimizers run their step in
FUSED_ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


def where_the_time_goes(cfg: WindTunnelConfig, steps: int) -> tuple[dict[str, float], float]:
    """Shares of the profiled time of a run of ``steps`` steps of the PyTorch path, by group,
    and the profiled milliseconds per gradient."""
    from torch.profiler import ProfilerActivity, profile

    run = dataclasses.replace(cfg, n_steps=steps)
    model = run.model()
    with attention_through(False), profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        gradients = len(run.train(model, every=run.n_steps, progress=False).loss)
        ms = 1000 * (time.perf_counter() - start) / gradients
    events = prof.key_averages()
    names = {e.key for e in events}
    for needed in (OPTIMIZER, FUSED_ATTENTION):  # without them, their time would fall in the rest unseen
        if needed not in names:
            raise RuntimeError(f"the profile has no {needed!r} event: the groups no longer fit this PyTorch")
    total = sum(e.self_cpu_time_total for e in events)
    shares = {name: 0.0 for name in [*GROUPS, "AdamW"]}
    for e in events:
        for name, keys in GROUPS.items():
            if any(k in e.key for k in keys):
                shares[name] += e.self_cpu_time_total
                break
    shares["AdamW"] = sum(e.cpu_time_total for e in events if e.key == OPTIMIZER)
    shares["the rest"] = total - sum(shares.values())
    if shares["the rest"] < 0:
        raise RuntimeError(f"the groups overlap: they add up to more than the profiled time ({shares})")
    return {name: v / total for name, v in shares.items()}, ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="steps of each timed run (>= 10)")
    ap.add_argument("--repeats", type=int, default=3, help="pairs of timed runs, one per path (>= 1)")
    ap.add_argument("--profile", action="store_true", help="also print where a step's time goes")
    ap.add_argument("--profile-steps", type=int, default=30, help="steps of the profiled run (>= 10)")
    args = ap.parse_args()
    for name in ("steps", "profile_steps"):
        if getattr(args, name) < 10:
            ap.error(f"--{name.replace('_', '-')} must be >= 10, got {getattr(args, name)}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    torch.set_num_threads(1)  # matmul_gflops and product_gflops time with the threads set
    cfg = paper_settings()
    model_cfg, T = cfg.model().cfg, cfg.task.length
    parts = counted_flop(cfg)
    flop = sum(parts.values())
    peak = [matmul_gflops(1)]
    own = {name: product_gflops(*ab) for name, ab in own_shapes(model_cfg, T, cfg.batch).items()}
    times = {c: [] for c in PATHS}
    for r in range(args.repeats):
        for compiled in (True, False) if r % 2 == 0 else (False, True):
            times[compiled].append(ms_per_step(cfg, args.steps, compiled))
    peak = max(peak + [matmul_gflops(1)])
    chosen = native.planned_paths()["causal_attention"] == "kernel"
    _, why = native.choice_reason("causal_attention")
    print(f"CPU: {cpu_model()}, 1 thread; the paper profile's wind tunnel: V = {cfg.V}, L = {cfg.L} ({T} "
          f"positions), {cfg.n_layers} layers {cfg.d_model} wide, {cfg.n_heads} heads, batch {cfg.batch}; "
          f"{args.repeats} pair(s) of runs of {args.steps} steps")
    print(f"counted work per step: {flop / 1e9:.3f} GFLOP (PyTorch's count, attention as plain products, the "
          f"masked pairs out), {100 * parts['attention'] / flop:.1f}% of it attention's")
    print(f"float32 matmul (1024^3) {peak:.1f} GFLOP/s (the higher of a measurement before and one after); "
          f"products of the model's own shapes: " + ", ".join(f"{n} {r:.1f}" for n, r in own.items()))
    best = {c: min(v) for c, v in times.items()}
    for compiled, label in PATHS.items():
        tag = " (the library's choice here)" if compiled == chosen else ""
        print(f"{label + tag:46s} {best[compiled]:7.2f} ms per step, the fastest of "
              + ", ".join(f"{t:.2f}" for t in times[compiled])
              + f"; {flop / best[compiled] / 1e6:5.1f} GFLOP/s, {100 * flop / best[compiled] / 1e6 / peak:3.0f}% "
              f"of the matmul peak")
    ratios = [s / k for s, k in zip(times[False], times[True])]
    print(f"SDPA / compiled attention, pair by pair: {', '.join(f'{x:.2f}' for x in ratios)}x (median "
          f"{statistics.median(ratios):.2f}x); the library's choice here: "
          f"{'the kernel' if chosen else 'PyTorch SDPA'} ({why}); a {cfg.n_steps}-step run through it: "
          f"{(cfg.n_steps + 1) * best[chosen] / 1000:.0f} s of training steps")
    if args.profile:
        shares, ms = where_the_time_goes(cfg, args.profile_steps)
        print(f"where a step's time goes (PyTorch path, a run of {args.profile_steps} steps under PyTorch's "
              f"profiler, {ms:.2f} ms per step there): " + ", ".join(f"{n} {100 * s:.0f}%" for n, s in shares.items()))


if __name__ == "__main__":
    main()
