"""What a Dask worker's default settings cost the training: the same wind-tunnel run (the
paper profile's model and batch) as a task on a fresh one-worker ``LocalCluster`` under each
setting, and in a plain process for reference, interleaved so that a drift of the machine
falls on all, in milliseconds per step and minor page faults per step.

- ``MALLOC_TRIM_THRESHOLD_=65536``, which a Dask nanny sets for the worker it starts
  (``distributed.nanny.pre-spawn-environ``): setting it at all fixes glibc's mmap threshold
  at 128 KiB, so every larger tensor is mapped and unmapped again and its pages fault in on
  every step;
- the worker's statistical profiler (``distributed.worker.profile``), which wakes every
  10 ms and walks the stack of the task's thread, holding the interpreter lock meanwhile.

A benchmark, not a test: timings depend on the machine; the ratios are what count.

    .venv/bin/python benchmarks/dask_workers.py                 # 3 repeats of 100 steps
    .venv/bin/python benchmarks/dask_workers.py --steps 200 --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from attention_dynamics.machine import cpu_model

TRIM = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
PROFILE = "distributed.worker.profile.enabled"
SETTINGS = {
    "Dask defaults": {},
    "no MALLOC_TRIM": {TRIM: None},
    "no profiler": {PROFILE: False},
    "neither": {TRIM: None, PROFILE: False},
}
PLAIN = "plain process"


def train(steps: int) -> dict:
    """``steps`` timed AdamW steps of the wind tunnel after a warm-up run of ten, one thread."""
    import resource
    import time

    import torch

    from attention_dynamics.windtunnel import WindTunnelConfig

    torch.set_num_threads(1)
    WindTunnelConfig(V=8, L=7, n_steps=10, batch=128).train(WindTunnelConfig(V=8, L=7).model(), progress=False)
    cfg = WindTunnelConfig(V=8, L=7, n_steps=steps, batch=128)
    model = cfg.model()
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    cfg.train(model, progress=False)
    seconds = time.perf_counter() - start
    return {"ms": 1e3 * seconds / steps, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps,
            "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_")}


def on_dask(setting: dict, steps: int) -> dict:
    import dask
    from distributed import Client, LocalCluster

    before = dict(os.environ)
    try:
        with dask.config.set(setting), \
                LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            return client.submit(train, steps, pure=False).result()
    finally:  # a LocalCluster's nanny writes its pre-spawn environment into this process's and leaves it
        os.environ.clear()
        os.environ.update(before)


def in_a_plain_process(steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | {"OMP_NUM_THREADS": "1"}
    code = f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import dask_workers as d; " \
           f"print(json.dumps(d.train({steps})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="timed training steps per run (>= 10)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each setting, interleaved (>= 1)")
    args = ap.parse_args(argv)
    if args.steps < 10:
        ap.error(f"--steps = {args.steps} must be >= 10")
    if args.repeats < 1:
        ap.error(f"--repeats = {args.repeats} must be >= 1")
    os.environ["OMP_NUM_THREADS"] = "1"
    print(f"{cpu_model()}; wind tunnel V=8, L=7, batch 128, 1 thread, {args.steps} steps per run", flush=True)
    got = {s: [] for s in [PLAIN, *SETTINGS]}
    for r in range(args.repeats):
        for name in got:
            x = in_a_plain_process(args.steps) if name == PLAIN else on_dask(SETTINGS[name], args.steps)
            got[name].append(x)
            print(f"  repeat {r + 1}  {name:<15} {x['ms']:7.2f} ms/step  {x['faults']:8.1f} minor faults/step  "
                  f"(MALLOC_TRIM_THRESHOLD_={x['trim']})", flush=True)
    base = statistics.median(x["ms"] for x in got[PLAIN])
    print(f"median ms/step, and the ratio to the {PLAIN}:")
    for name, xs in got.items():
        med = statistics.median(x["ms"] for x in xs)
        print(f"  {name:<15} {med:7.2f}  {med / base:5.2f}x")


if __name__ == "__main__":
    main()
