"""The committed records of the last ``gpu`` build (results/gpu/): the chapters that have a
gpu profile, run at Paper I's size on an accelerator. Such a build needs a CUDA device, which
the CI machine does not have, so its records are committed when a session has one; each
must be a record of the chapter as it is now, made on a CUDA device, with the steps it ran
those its time budget allowed (recomputed from the step time it measured). With no such
record committed there is nothing to check, and the checker's own controls still run."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from attention_dynamics.book.cache import cache_key
from attention_dynamics.book.jobs import make_jobs, results_folder
from attention_dynamics.book.publishing import trained_on_cuda
from attention_dynamics.devices import steps_that_fit

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / results_folder("gpu")
JOBS = {j.name: j for j in make_jobs(ROOT, "gpu")}


def problems(record: dict, job) -> list[str]:  # also read by tests/test_devices.py
    """What keeps ``record`` from being the gpu build of ``job`` as the code is now."""
    prov, v = record.get("provenance", {}), record.get("values", {})
    found = []
    if prov.get("profile") != "gpu" or prov.get("parameters") != job.parameters:
        found.append("not made at the gpu profile's parameters")
    if prov.get("cache_key") != cache_key(job):
        found.append(f"stale: rerun it (python -m attention_dynamics.book --profile gpu --only {job.name})")
    if not trained_on_cuda(record) or prov.get("device") != v.get("device"):
        found.append(f"not trained on a CUDA device (provenance: {prov.get('device')!r})")
    budget = job.parameters.get("time_budget_s", 0.0)
    if budget > 0:
        runs = 2 * (1 + len(job.parameters["more_seeds"]))
        try:
            allowed = steps_that_fit(v["step_seconds"], budget, runs=runs, n_steps=job.parameters["wind_tunnel"]["n_steps"])
        except (KeyError, TypeError, ValueError) as e:
            found.append(f"the steps the budget allows cannot be recomputed ({type(e).__name__}: {e})")
        else:
            if v.get("n_steps") != allowed:
                found.append(f"ran {v.get('n_steps')} steps where the budget allows {allowed}")
            # the step time that sized the runs must describe them: the main run's training
            # within a factor 2 either way of n_steps x step_seconds (named before any run: a
            # probe off by more misspends the budget by as much)
            seconds, steps = v.get("seconds"), v.get("n_steps")
            ratio = seconds / (steps * v["step_seconds"]) if seconds and steps else 0.0
            if not 0.5 <= ratio <= 2.0:
                found.append(f"the main run took {ratio:.2f} x n_steps x step_seconds, outside 0.5 to 2")
    if v.get("n_steps_asked") != job.parameters["wind_tunnel"]["n_steps"]:
        found.append("n_steps_asked is not the profile's n_steps")
    return found


@pytest.mark.parametrize("path", sorted(FOLDER.glob("*.json")), ids=lambda p: p.stem)
def test_committed_gpu_record(path):
    assert path.stem in JOBS, f"{path.name}: no chapter has a gpu profile of that name"
    assert not problems(json.loads(path.read_text(encoding="utf-8")), JOBS[path.stem])


def _made_by_construction() -> tuple[dict, object]:
    """A record as a gpu build of the calibration chapter on a CUDA device would write it."""
    job = JOBS["wt_calibration"]
    p = job.parameters
    step = 0.004
    device = "NVIDIA H100 80GB HBM3 (CUDA 12.8, torch 2.13.0)"
    n = steps_that_fit(step, p["time_budget_s"], runs=2 * (1 + len(p["more_seeds"])),
                       n_steps=p["wind_tunnel"]["n_steps"])
    values = {"device": device, "step_seconds": step, "n_steps_asked": p["wind_tunnel"]["n_steps"], "n_steps": n,
              "seconds": 1.1 * n * step}
    prov = {"profile": "gpu", "parameters": job.parameters, "cache_key": cache_key(job), "device": device}
    return {"values": values, "provenance": prov}, job


def test_the_checker_passes_a_record_made_right_and_names_each_fault():
    record, job = _made_by_construction()
    assert problems(record, job) == []  # positive control
    for change, expected in [
        (lambda r: r["provenance"].update(cache_key="0" * 64), "stale"),
        (lambda r: r["provenance"].update(profile="paper"), "gpu profile"),
        (lambda r: [r["provenance"].update(device="the CPU"), r["values"].update(device="the CPU")], "CUDA"),
        (lambda r: r["values"].update(n_steps=r["values"]["n_steps"] - 1), "the budget allows"),
        (lambda r: r["values"].pop("step_seconds"), "cannot be recomputed"),
        (lambda r: r["values"].update(seconds=3 * r["values"]["seconds"]), "outside 0.5 to 2"),
        (lambda r: r["values"].update(n_steps_asked=10), "n_steps_asked"),
    ]:
        wrong = copy.deepcopy(record)
        change(wrong)
        found = problems(wrong, job)
        assert len(found) == 1 and expected in found[0], (expected, found)
