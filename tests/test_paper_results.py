"""The committed records of the last `paper` build (results/paper/), so that CI judges the
paper-scale claims without the long build.

They must be the records of the chapters as they are now: the runner's cache key (notebook,
paper parameters, the library modules the chapter imports) must match. After changing a
chapter or a module it imports, rerun the paper build of that chapter
(`python -m attention_dynamics.book --profile paper --only NAME`), which rewrites its
record here and prints the claims that moved.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from attention_dynamics.book.runner import RESULTS, cache_key, make_jobs
from attention_dynamics.claims import CLAIMS, HOLDS, UNMEASURED, evaluate

ROOT = Path(__file__).resolve().parents[1]
JOBS = make_jobs(ROOT, "paper")

# The verdicts of the last paper build, claim by claim. A rebuild that changes one turns
# this test red on purpose: the book's findings changed, and whoever rebuilt says so here.
EXPECTED_VERDICTS: dict[str, str] = {
    "r1_exact": "holds",
    "r1_head": "holds partly",
    "r1_transformer": "does not hold",
    "r2_exact": "holds",
    "r2_transformer": "does not hold",
    "r3_exact": "holds",
    "r4_slope": "holds",
    "r5_entropy": "holds",
    "r5_specialization": "holds",
    "r5_symmetry": "holds",
    "r6_e_step": "holds",
    "r6_hard": "holds",
    "r6_soft": "holds partly",
    "r6_faster_values": "holds",
    "r7_seed_exact": "holds",
    "r7_sgd_final": "holds",
    "r7_em_final": "holds",
    "r7_reach_steps": "holds",
    "r7_speedup": "holds",
    "r7_em_ahead": "holds",
    "r7_accuracy": "holds",
    "r7_deep": "holds partly",
    # issue 17: judged on seeds 0, 1, 2 (was seed 0 alone, 0.0048 bits here, 0.0123 on an Intel
    # Xeon): seeds 1 and 2 end at 0.38 bits, the 95% interval of the mean spans both bars
    "r8_calibration": "inconclusive",
    "r8_keys": "does not hold",
    # issue 17: judged on seeds 0, 1, 2 (was seed 0 alone: 0.47 here, 0.52 on the Intel Xeon);
    # 0.47, 0.32, 0.30: the 95% interval of the mean, 0.14 to 0.59, crosses the 0.5 bar
    "r8_values": "inconclusive",
    "r8_control": "does not hold",
    "r8_focusing": "holds partly",
    "r8_frame": "inconclusive",
    "r8_ablations": "holds partly",
    "r9_ssm_exact": "holds",
    "r9_ssm_reference": "holds",
    "r9_attention_law": "holds partly",
    "r9_ssm_law": "inconclusive",
    "r9_accumulation": "holds",
    "r9_transport": "holds",
    "r9_binding": "holds partly",
}


def _record(name: str) -> dict:
    path = ROOT / RESULTS / f"{name}.json"
    if not path.is_file():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: run the paper build "
                    f"(python -m attention_dynamics.book --profile paper --only {name})")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("job", JOBS, ids=[j.name for j in JOBS])
def test_record_is_of_this_code_at_paper_scale(job):
    prov = _record(job.name)["provenance"]
    assert prov["profile"] == "paper"
    assert prov["parameters"] == job.parameters
    assert prov["cache_key"] == cache_key(job), (
        f"results/paper/{job.name}.json is stale: the notebook, its paper parameters or a "
        f"library module it imports changed since the paper build; rerun it "
        f"(python -m attention_dynamics.book --profile paper --only {job.name})")


def test_paper_scale_verdicts():
    rows = evaluate({j.name: _record(j.name) for j in JOBS})
    assert not [r["key"] for r in rows if r["verdict"] == UNMEASURED]
    exact = [r for r in rows if r["paper"] == "an exact identity"]
    assert exact and all(r["verdict"] == HOLDS for r in exact), exact
    found = {r["key"]: r["verdict"] for r in rows}
    assert set(EXPECTED_VERDICTS) == {c.key for c in CLAIMS}
    changed = {k: (EXPECTED_VERDICTS[k], v) for k, v in found.items() if v != EXPECTED_VERDICTS[k]}
    assert not changed, f"paper-scale verdicts changed (expected, found): {changed}"
