"""Speed of the deep sticky-chain variant (R7; 5 seeds x 2000 AdamW steps of a 4-layer
transformer on 1999 positions), the largest share of the paper build: the levers measured
side by side in this one process, in milliseconds per seed-step.

- the compiled causal attention (attention_dynamics.native) against PyTorch's fused
  scaled_dot_product_attention, with one and with two threads, and the path the library
  chooses on this processor;
- the five seeds as one batched model (torch.func.stack_module_state + vmap, gradients
  only, no optimizer step: a lower bound of its cost).

Each contender's rate is its counted work (flop_per_seed_step) over its time, against a
float32 matmul (1024^3) measured in this run with the same threads: the share of the
machine's matmul peak the deep variant reaches.

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

from sticky_chain_speed import matmul_gflops  # noqa: E402  (this folder is the script's sys.path[0])

CFG = TransformerConfig(n_out=8, d_model=64, n_layers=4, n_heads=4, d_ff=256, dropout=0.1, input="linear", d_in=20)
T, N_SEEDS = 1999, len(sc.SEEDS)  # the protocol's sequence length, the five seeds


def flop_per_seed_step(cfg: TransformerConfig, T: int) -> float:
    """Floating-point operations (a multiply-add counts 2) counted for one training step of
    one seed: the model's matrix products as it writes them, each visible (query, key) pair
    once (the scores q.k and the read-out alpha v: 2 x 2 d_model per pair, over the heads),
    three times over (the backward pass makes two products for each: the gradients of its
    input and of its weight), except the input map's, twice (x is data: its gradient is not
    needed). Not counted: softmax, the layer norms, GELU, dropout and AdamW, O(T d) each.
    tests/test_speed_profile.py checks it against PyTorch's own count."""
    d, pairs = cfg.d_model, T * (T + 1) / 2
    layer = 2 * T * d * 4 * d + 2 * 2 * T * d * cfg.d_ff + 2 * 2 * pairs * d  # q, k, v, proj; ff; scores, read-out
    return 3 * (cfg.n_layers * layer + 2 * T * d * cfg.n_out) + 2 * 2 * T * cfg.d_in * d


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
    res, peak = {}, {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        peak[threads] = matmul_gflops(threads)
        with attention_through(True):
            res[f"compiled attention, {threads} thread(s)"] = serial(x, y, args.steps)
        with attention_through(False):
            res[f"PyTorch SDPA, {threads} thread(s)"] = serial(x, y, args.steps)
    torch.set_num_threads(1)
    # vmap cannot run the model's data-dependent input checks, nor the kernel's autograd
    # Function: checks off, SDPA
    with attention_through(False), mock.patch.object(tr, "check_model_input", lambda *a, **k: None):
        res["vmap over the 5 seeds (SDPA, gradients only), 1 thread"] = batched(x, y, args.steps)
    flop = flop_per_seed_step(CFG, T)
    print(f"CPU: {cpu_model()}; T = {T}, {N_SEEDS} seeds, {args.steps} timed steps each; "
          f"{flop / 1e9:.2f} GFLOP of counted work per seed-step; float32 matmul (1024^3) here: "
          f"{peak[1]:.1f} GFLOP/s with 1 thread, {peak[2]:.1f} with 2")
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
