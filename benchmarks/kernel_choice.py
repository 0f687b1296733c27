"""Which path is faster on this processor, each compiled kernel or its PyTorch path, at the
sizes the book runs them: the measurement behind attention_dynamics.native's choice.

Every contender runs forward and backward, one thread, alternating kernel and PyTorch in
each repeat (so a slow spell of the machine hits both); the median of the repeats counts.
A kernel's ratio on a processor is the smallest of its ratios over the book's sizes (PyTorch
time / kernel time): it must win at every size it would serve. It becomes the default
where that ratio is at least attention_dynamics.native.MARGIN.

A benchmark, not a test: timings depend on the machine.

    .venv/bin/python benchmarks/kernel_choice.py             # print ratios and the choice
    .venv/bin/python benchmarks/kernel_choice.py --record    # and commit them to native/speed.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import time

import torch

import attention_dynamics.native as native
from attention_dynamics.causal_head import blocked_causal_step, init_heads
from attention_dynamics.machine import cpu_model, processor_key
from attention_dynamics.ssm import ssm_scan
from attention_dynamics.tasks import sticky_chain as sc
from attention_dynamics.transformer import causal_attention


def attention_case(B, H, T, D):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g, requires_grad=True) for _ in range(3))
    go = torch.randn(B, H, T, D, generator=g)

    def run(compiled):
        torch.autograd.grad(causal_attention(q, k, v, compiled=compiled), (q, k, v), go)
    return run


def head_case(runs, seq_len):
    seq = sc.sample_sequences(list(range(runs)), seq_len=seq_len)
    p = init_heads(list(range(runs)))
    return lambda compiled: blocked_causal_step(p, seq.x, seq.y, native=compiled)


def scan_case(Bt, T, Dc, N):
    g = torch.Generator().manual_seed(0)
    x, B, C = (torch.randn(*s, generator=g) for s in ((Bt, T, Dc), (Bt, T, N), (Bt, T, N)))
    ins = [x, torch.rand(Bt, T, Dc, generator=g) + 0.05, -torch.rand(Dc, N, generator=g) - 0.1, B, C]
    ins = [t.requires_grad_() for t in ins]
    gy = torch.randn(Bt, T, Dc, generator=g)

    def run(compiled):
        torch.autograd.grad(ssm_scan(*ins, compiled=compiled), ins, gy)
    return run


# the sizes each computation has in the book's paper profile
CASES = {
    "causal_attention": {
        "deep variant (1 x 4 heads x 1999 x 16)": lambda: attention_case(1, 4, 1999, 16),
        "wind tunnel (128 x 4 heads x 15 x 16)": lambda: attention_case(128, 4, 15, 16),
        "primitives (64 x 4 heads x 32 x 8)": lambda: attention_case(64, 4, 32, 8),
    },
    "causal_head": {
        "sticky-chain protocol (10 runs x 1999 positions)": lambda: head_case(10, 2000),
    },
    "selective_scan": {
        "primitives (64 x 32 x 64 channels x 8 states)": lambda: scan_case(64, 32, 64, 8),
    },
}


def seconds(fn, compiled) -> float:
    start = time.perf_counter()
    fn(compiled)
    return time.perf_counter() - start


def measure(repeats: int) -> dict:
    out = {}
    for name, cases in CASES.items():
        shapes = {}
        for label, make in cases.items():
            fn = make()
            fn(True), fn(False)  # build, warm up
            kernel, torch_path = [], []
            for _ in range(repeats):
                kernel.append(seconds(fn, True))
                torch_path.append(seconds(fn, False))
            k, t = statistics.median(kernel), statistics.median(torch_path)
            shapes[label] = {"kernel_ms": round(1e3 * k, 3), "torch_ms": round(1e3 * t, 3), "ratio": round(t / k, 3)}
        out[name] = {"ratio": min(s["ratio"] for s in shapes.values()), "sizes": shapes}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per contender (default 7)")
    ap.add_argument("--record", action="store_true", help=f"write the ratios for this processor to {native.SPEED_FILE}")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    torch.set_num_threads(1)
    results = measure(args.repeats)
    key = processor_key()
    print(f"CPU: {cpu_model()} [{key}]; 1 thread, median of {args.repeats} repeats, forward and backward")
    for name, r in results.items():
        for label, s in r["sizes"].items():
            print(f"  {name:17s} {label:50s} kernel {s['kernel_ms']:9.2f} ms  PyTorch {s['torch_ms']:9.2f} ms  "
                  f"{s['ratio']:5.2f}x")
        choice = "kernel" if r["ratio"] >= native.MARGIN else "PyTorch"
        print(f"  -> {name}: smallest ratio {r['ratio']:.2f}x, margin {native.MARGIN}: {choice}")
    # what made the kernels timed here: a ratio holds for that compiler and build target
    cc = native._compiler()
    compiler = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0] if cc else None
    print(f"compiler: {compiler}; kernels built for: {native._targets}")
    if args.record:
        table = native.measurements()
        stamp = dt.date.today().isoformat()
        for name, r in results.items():
            table.setdefault(name, {})[key] = dict(r, cpu=cpu_model(), measured=stamp, compiler=compiler,
                                                   build=native._targets.get(name, "?"),
                                                   command=f"benchmarks/kernel_choice.py --repeats {args.repeats}")
        native.SPEED_FILE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"recorded in {native.SPEED_FILE}")
    print("now chosen here:", {n: native.choice_reason(n)[1] for n in native.KERNELS})


if __name__ == "__main__":
    main()
