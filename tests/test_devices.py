"""attention_dynamics.devices: a wind-tunnel run on an accelerator, tested on the CPU. The
accelerator's path, run on the CPU, must reproduce the config's own run bit for bit (same
draws, same loop, states and losses), be stored under a key of its own, and hand back its
checkpoints on the CPU; the device names are validated; the steps that fit a budget are
the arithmetic they claim."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attention_dynamics import devices
from attention_dynamics.devices import (device_label, resolve_device, seconds_per_step, steps_that_fit,
                                        trajectory_on)
from attention_dynamics.machine import cpu_model
from attention_dynamics.windtunnel import WindTunnelConfig

TINY = WindTunnelConfig(V=4, L=3, d_model=16, n_heads=2, n_steps=12, batch=8, eval_size=16)


def test_the_accelerators_path_on_the_cpu_is_the_cpu_run_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    plain = TINY.trajectory(every=4, progress=False)
    moved = devices._trajectory_on(TINY, 4, torch.device("cpu"), progress=False, desc="test")
    assert moved.steps == plain.steps == [0, 4, 8, 12]
    np.testing.assert_array_equal(moved.loss, plain.loss)
    for a, b in zip(plain.states, moved.states):
        for name, t in a["model"].items():
            assert b["model"][name].device.type == "cpu" and torch.equal(t, b["model"][name])
        sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
        assert sa.keys() == sb.keys()
        for i in sa:
            for k in sa[i]:
                assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k]))
    # its own key (the device is a setting), and the device named in its provenance
    assert moved.provenance["key"] != plain.provenance["key"]
    assert moved.provenance["device"] == device_label("cpu")
    again = devices._trajectory_on(TINY, 4, torch.device("cpu"), progress=False, desc="test")
    assert again.provenance["loaded"] and again.provenance["key"] == moved.provenance["key"]


def test_on_the_cpu_trajectory_on_is_the_shared_stored_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    first = TINY.trajectory(every=4, progress=False)
    shared = trajectory_on(TINY, 4, "cpu", progress=False)
    assert shared.provenance["loaded"] and shared.provenance["key"] == first.provenance["key"]


def test_devices_are_validated(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device = 'cuda', but this machine has no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")


def test_steps_that_fit_a_budget():
    # 100 s for 4 runs at 0.05 s a step: 25 s each, 500 steps; capped at n_steps
    assert steps_that_fit(0.05, 100.0, runs=4, n_steps=100_000) == 500
    assert steps_that_fit(0.05, 100.0, runs=4, n_steps=300) == 300
    assert steps_that_fit(0.03, 1.0, runs=1, n_steps=1000) == math.floor(1.0 / 0.03)
    with pytest.raises(ValueError, match=r"time_budget_s = 0.1 fits 2 steps .* at least 10"):
        steps_that_fit(0.05, 0.1, runs=1, n_steps=1000)
    with pytest.raises(ValueError, match="time_budget_s must be"):
        steps_that_fit(0.05, -1.0, runs=1, n_steps=1000)
    with pytest.raises(ValueError, match="step_seconds must be"):
        steps_that_fit(0.0, 10.0, runs=1, n_steps=1000)


def test_seconds_per_step_times_the_loop_and_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    clock = iter(range(1000))
    monkeypatch.setattr(devices.time, "perf_counter", lambda: float(next(clock)))
    # one stamp a step, one second apart on this clock: one second a step
    assert seconds_per_step(TINY, "cpu", steps=6, warmup=4) == 1.0
    assert not list(tmp_path.iterdir())


def test_the_gpu_profile_runs_on_the_cpu_at_a_tiny_size(tmp_path, monkeypatch, root):
    """The calibration chapter at its gpu profile (device auto, a time budget that binds),
    shrunk: it runs where no accelerator is (here, on the CPU), times a step, trains the
    steps the budget allows and records them, the step's time and the device; the checker
    of committed gpu records (tests/test_gpu_results.py) reads this very record and finds
    that it did not train on CUDA, and nothing else but, on a loaded machine, the step time
    (its band is for an accelerator that trains alone)."""
    from attention_dynamics.book.cli import main
    from attention_dynamics.book.jobs import make_jobs
    from attention_dynamics.book.scheduling import THREAD_VARIABLES
    from test_gpu_results import problems

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path / "store"))
    # the chapter's kernel on one thread, as the session's own tests run: with one worker the
    # runner leaves it the environment's threads (PyTorch's default, every CPU), and beside the
    # quick book's two workers each of its parallel regions waited on a descheduled thread:
    # beside two busy one-thread processes on an AMD EPYC 25/1, a step took 0.193 s on two
    # threads (10 steps fit, the test failed) and 0.0046 s on one (435 fit)
    for var in THREAD_VARIABLES:
        monkeypatch.setenv(var, "1")
    small = "{V: 5, L: 4, d_model: 16, n_layers: 1, n_heads: 2, n_steps: 100000, batch: 8, eval_size: 32}"
    # 8 s for 4 runs gives each at least 10 steps (of eval_every, and 12 for the V = 6 runs'
    # 10) up to 0.15 s a step, 50 times this model's step on an idle core
    sets = [f"wind_tunnel={small}", "larger_V=6", "eval_every=10", "time_budget_s=8"]
    out = tmp_path / "out"
    assert main(["--profile", "gpu", "--only", "wt_calibration", "--out", str(out), "--workers", "1",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    record = json.loads((out / "wt_calibration.json").read_text())
    v = record["values"]
    assert record["provenance"]["profile"] == "gpu" and v["n_steps_asked"] == 100_000
    assert 12 <= v["n_steps"] == steps_that_fit(v["step_seconds"], 8.0, runs=4, n_steps=100_000) < 100_000
    # the chapter ran on the threads the environment names (one, set above)
    assert v["device"] == record["provenance"]["device"] and v["device"].startswith("the CPU, ")
    assert v["device"].endswith(f" 1 thread(s) of {cpu_model()}")
    assert f"| trained on | {v['device']} |" in (out / "wt_calibration.ipynb").read_text()
    (job,) = make_jobs(root, "gpu", overrides=record["provenance"]["parameters"], out_dir=out)  # the --set values
    found = problems(record, job)
    assert found[0].startswith("not trained on a CUDA device")
    assert all("outside 0.5 to 2" in f for f in found[1:]), found


def test_the_device_script_parses_and_refuses_to_run_without_its_wheels(root, tmp_path):
    """benchmarks/gpu_profile.sh, the command a session with a lent accelerator runs: valid
    shell, and its run step stops at once, naming the missing step, where the wheels it
    installs from were not carried (a copy of the script in a tree without them)."""
    import shutil
    import subprocess

    script = root / "benchmarks" / "gpu_profile.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(script, tmp_path / "benchmarks" / script.name)
    done = subprocess.run(["bash", str(tmp_path / "benchmarks" / script.name), "run"], capture_output=True, text=True)
    assert done.returncode == 2 and "no .device-wheels/: run" in done.stderr
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage:" in done.stderr
