"""Speed of the deep sticky-chain variant (R7; 5 seeds x 2000 AdamW steps of a 4-layer
transformer on 1999 positions), the largest share of the paper build: the levers measured
side by side in this one process, in milliseconds per seed-step.

- the compiled causal attention (attention_dynamics.native) against PyTorch's fused
  scaled_dot_product_attention, with one and with two threads, and the path the library
  chooses on this processor;
- the five seeds as one batched model (torch.func.stack_module_state + vmap, gradients
  only, no optimizer step: a lower bound of its cost).

Each contender's rate is its counted work (flop_per_seed_step: the model's FLOP, no
recomputation, no masked pair) over its time, against a float32 matmul (1024^3) measured in
this run with the same threads, the highest of a measurement before and one after the
contenders: the share of the machine's matmul peak the deep variant reaches. Both attention
paths make more than is counted (their backward passes compute the scores again: about 7/6
of attention's counted products), so the share understates how busy the machine's
arithmetic units are. Most of the counted work is in products of the heads' width (16),
which no BLAS runs at the rate of a square matmul: the rates of products of the model's
own shapes, timed the same way, are printed beside the peak (a layer's scores made whole
as one batched product write T x T numbers per head, and run at the memory's pace: what a
fused attention, which never writes them, is spared).

A benchmark, not a test: timings depend on the machine; the ratios are what count.

    .venv/bin/python benchmarks/deep_variant_speed.py            # 3 steps per contender
    .venv/bin/python benchmarks/deep_variant_speed.py --steps 5
"""
from __future__ import annotations

import argparse
import copy
import time
from unittest import mock

import torch
from torch.func import functional_call, grad, stack_module_state, vmap

import attention_dynamics.native as native
import attention_dynamics.transformer as tr
from attention_dynamics.machine import cpu_model
from attention_dynamics.tasks import sticky_chain as sc
from attention_dynamics.transformer import CausalTransformer, TransformerConfig

from sticky_chain_speed import matmul_gflops, product_gflops  # noqa: E402  (this folder is the script's sys.path[0])

CFG = TransformerConfig(n_out=8, d_model=64, n_layers=4, n_heads=4, d_ff=256, dropout=0.1, input="linear", d_in=20)
T, N_SEEDS = 1999, len(sc.SEEDS)  # the protocol's sequence length, the five seeds


def flop_parts(cfg: TransformerConfig, T: int) -> dict[str, float]:
    """Floating-point operations (a multiply-add counts 2) counted for one training step of
    one seed, in two parts: "attention", the scores q.k and the read-out alpha v, each visible
    (query, key) pair once (2 x 2 d_model per pair, over the heads); "dense", the linear maps
    (q, k, v and the output projection, the feed-forward pair, the input and output maps).
    Each product three times over (the backward pass makes two: the gradients of each
    operand), except the input map's, twice (x is data: its gradient is not needed). Not
    counted: the softmax's exponentials, O(T^2 H) per layer; the layer norms, GELU and
    dropout, O(T d); AdamW, O(parameters); and what a path computes again in its backward
    pass or for masked pairs. tests/test_speed_profile.py checks each part against PyTorch's
    own count."""
    d, pairs = cfg.d_model, T * (T + 1) / 2
    layer = 2 * T * d * 4 * d + 2 * 2 * T * d * cfg.d_ff  # q, k, v, proj; ff
    return {"attention": 3 * cfg.n_layers * 2 * 2 * pairs * d,
            "dense": 3 * (cfg.n_layers * layer + 2 * T * d * cfg.n_out) + 2 * 2 * T * cfg.d_in * d}


def flop_per_seed_step(cfg: TransformerConfig, T: int) -> float:
    """The counted work of one seed-step: the sum of :func:`flop_parts`."""
    return sum(flop_parts(cfg, T).values())


def own_shapes(cfg: TransformerConfig, T: int, batch: int = 1) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Products of the model's own shapes for ``batch`` sequences of T positions: a layer's
    scores over all its heads (every pair, as a batched product makes them), a linear map of
    width d_model, the feed-forward's first."""
    h, d, n, rows = cfg.n_heads, cfg.d_model, batch * cfg.n_heads, batch * T
    return {f"scores ({n} x {T} x {d // h}) @ ({n} x {d // h} x {T})": ((n, T, d // h), (n, d // h, T)),
            f"linear ({rows} x {d}) @ ({d} x {d})": ((rows, d), (d, d)),
            f"feed-forward ({rows} x {d}) @ ({d} x {cfg.d_ff})": ((rows, d), (d, cfg.d_ff))}


def attention_in_plain_products(q, k, v, compiled=None):
    """Causal attention as two batched products PyTorch's flop counter sees (it does not count
    its fused CPU attention), every (query, key) pair computed and the masked ones dropped:
    its count of them is the visible pairs' over (T + 1) / (2 T)."""
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    masked = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1) @ v


def models() -> list[CausalTransformer]:
    out = []
    for s in range(N_SEEDS):
        torch.manual_seed(s)
        out.append(CausalTransformer(CFG))
    return out


def attention_through(compiled: bool):
    """Every attention call through the kernel (True) or PyTorch's fused attention (False),
    whatever the choice for this processor."""
    plain = tr.causal_attention

    def through(q, k, v, compiled=None):
        return plain(q, k, v, compiled=want)

    want = compiled
    return mock.patch.object(tr, "causal_attention", through)


def serial(x, y, steps: int) -> float:
    ms = models()
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-4) for m in ms]

    def step():
        for i, (m, o) in enumerate(zip(ms, opts)):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x[i])[0].reshape(-1, 8), y[i].reshape(-1))
            loss.backward()
            o.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps / N_SEEDS


def batched(x, y, steps: int) -> float:
    ms = models()
    params, buffers = stack_module_state(ms)
    base = copy.deepcopy(ms[0]).to("meta")

    def loss(p, b, xx, yy):
        return torch.nn.functional.cross_entropy(functional_call(base, (p, b), (xx,))[0].reshape(-1, 8), yy.reshape(-1))

    g = vmap(grad(loss), randomness="different")
    g(params, buffers, x, y)
    start = time.perf_counter()
    for _ in range(steps):
        g(params, buffers, x, y)
    return (time.perf_counter() - start) / steps / N_SEEDS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per contender (after one warm-up step)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    x, y = torch.randn(N_SEEDS, 1, T, 20), torch.randint(0, 8, (N_SEEDS, 1, T))
    res, peak, shapes = {}, {}, {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        peak[threads] = [matmul_gflops(threads)]
        shapes[threads] = {name: product_gflops(*ab) for name, ab in own_shapes(CFG, T).items()}
        with attention_through(True):
            res[f"compiled attention, {threads} thread(s)"] = serial(x, y, args.steps)
        with attention_through(False):
            res[f"PyTorch SDPA, {threads} thread(s)"] = serial(x, y, args.steps)
    torch.set_num_threads(1)
    # vmap cannot run the model's data-dependent input checks, nor the kernel's autograd
    # Function: checks off, SDPA
    with attention_through(False), mock.patch.object(tr, "check_model_input", lambda *a, **k: None):
        res["vmap over the 5 seeds (SDPA, gradients only), 1 thread"] = batched(x, y, args.steps)
    for threads in (1, 2):  # the peak again after the contenders: a slow spell at the start would lower it
        torch.set_num_threads(threads)
        peak[threads] = max(peak[threads] + [matmul_gflops(threads)])
    torch.set_num_threads(1)
    parts = flop_parts(CFG, T)
    flop = sum(parts.values())
    print(f"CPU: {cpu_model()}; T = {T}, {N_SEEDS} seeds, {args.steps} timed steps each; "
          f"{flop / 1e9:.2f} GFLOP of counted work (the model's FLOP) per seed-step, "
          f"{100 * parts['attention'] / flop:.0f}% of it in attention's products")
    for threads in (1, 2):
        own = ", ".join(f"{name} {rate:.1f}" for name, rate in shapes[threads].items())
        print(f"  {threads} thread(s): float32 matmul (1024^3) {peak[threads]:.1f} GFLOP/s (the higher of a "
              f"measurement before and one after the contenders); the model's own shapes: {own}")
    base = res["PyTorch SDPA, 1 thread(s)"]
    for k, v in res.items():
        threads = 2 if "2 thread" in k else 1
        print(f"{k:58s} {1000 * v:7.1f} ms per seed-step   {base / v:5.2f}x SDPA with 1 thread   "
              f"{flop / v / 1e9:5.1f} GFLOP/s, {100 * flop / v / 1e9 / peak[threads]:3.0f}% of the matmul peak")
    chosen, why = native.choice_reason("causal_attention")
    ratio = res["PyTorch SDPA, 1 thread(s)"] / res["compiled attention, 1 thread(s)"]
    print(f"whole seed-steps here, SDPA / kernel with 1 thread: {ratio:.2f}x; the library's choice on this "
          f"processor: {'the kernel' if chosen else 'PyTorch SDPA'} ({why}; benchmarks/kernel_choice.py measures it)")


if __name__ == "__main__":
    main()
