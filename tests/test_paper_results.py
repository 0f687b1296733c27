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

from attention_dynamics.book.cache import cache_key
from attention_dynamics.book.jobs import RESULTS, make_jobs
from attention_dynamics.claims import CLAIMS, evaluate
from attention_dynamics.rules import HOLDS, UNMEASURED

ROOT = Path(__file__).resolve().parents[1]
JOBS = make_jobs(ROOT, "paper")

# The verdicts of the last paper build, claim by claim. A rebuild that changes one turns
# this test red on purpose: the book's findings changed, and whoever rebuilt says so here.
EXPECTED_VERDICTS: dict[str, str] = {
    "r1_exact": "holds",
    # issue 18: the share of the head's movement that follows the law, pooled over the run,
    # against free scores from the same states (1.00), five seeds: 0.33 ± 0.10, interval 0.07 to
    # 0.60 across the 0.2 bar (was 0.75 "holds partly": one seed, a window chosen after looking)
    "r1_head": "inconclusive",
    "r1_insitu": "holds",
    # issue 18: the probe's steps moved a decade above the float64 floor of a realized change
    # (1e-3 to 1e-1): slopes 0.994 to 1.000 (was 0.35 with eta down to 1e-4, "does not hold")
    "r1_kernel": "holds",
    # issue 18: no correct model must pass an entry-by-entry test (was "does not hold")
    "r1_transformer": "observation only",
    "r2_exact": "holds",
    "r2_insitu": "holds",
    "r2_transformer": "observation only",  # issue 18: as r1_transformer (was "does not hold")
    "r3_exact": "holds",
    "r4_slope": "holds",
    "r5_entropy": "holds",  # issue 18: five seeds (was one)
    "r5_specialization": "holds",  # issue 18: five seeds (was one)
    # issue 18: with the routing-value loop cut, the values of 3 of 18 runs reach the spread at
    # which the full runs specialize
    "r5_symmetry": "holds",
    "r6_e_step": "holds",
    "r6_hard": "holds",
    "r6_soft": "holds partly",
    # issue 19: the paper's ratio 10 fixed in advance against ratio 1, paired log steps: 0.61 ± 0.25,
    # 90% interval 0.07 to 1.15 against the margin ln 1.25 = 0.22 (was the sweep's best ratio, chosen
    # by looking, tested on the same seeds, "holds")
    "r6_faster_values": "holds partly",
    "r7_seed_exact": "holds",
    "r7_fast_path": "holds",
    # issue 19: the script's own runs, which seed-exactness decides, shown as observations of the
    # same runs (were four more "holds" of Welch tests against the script's summary)
    "r7_sgd_final": "observation only",
    "r7_em_final": "observation only",
    "r7_reach_steps": "observation only",
    # issue 19: equivalence with the paper's "about 2.3": 2.18x, 90% interval 1.58 to 3.54 against
    # the band 2.0 to 2.65 (was "holds" because 2.3 lay inside a 95% interval that passes nearly
    # any speedup at five seeds)
    "r7_speedup": "inconclusive",
    "r7_em_ahead": "holds",  # issue 19: 0.099 ± 0.005 nats, past the margin of 0.025
    "r7_accuracy": "observation only",  # issue 19: as r7_sgd_final
    # issue 19: judged on the held-out loss: 6.53 ± 0.05 nats, interval 6.39 to 6.67, all above the
    # uniform guess ln 8 = 2.08 (was test accuracy 0.189 above chance 1/8, "holds partly")
    "r7_deep": "does not hold",
    # issue 19 (new, beyond): tuned alike, each rate one grid step back from the edge of
    # stability, SGD reaches the held-out level in 50 steps against EM-style's 65 (ln ratio
    # -0.26, 90% interval -0.37 to -0.14), Adam in 3 (-3.05); the rule's controls hold (half the
    # rate: holds; the twin: the same)
    "r7_tuned_sgd": "does not hold",
    "r7_tuned_adam": "does not hold",
    "r7_fast_group": "observation only",
    # issue 19 (new): the arms tuned for speed end above ln 8 on held-out data (SGD 2.18, Adam
    # 2.90) where EM-style ends at 1.98: they overfit the one training sequence afterwards
    "r7_tuned_final": "observation only",
    # issue 19: on the EM task, with the back-off from the edge of stability, no test seed
    # diverges and both controls hold; SGD 54 steps against EM-style's 94, interval -1.11 to
    # 0.005 (inconclusive); Adam 24 steps, -1.37, interval -2.29 to -0.44 (was inconclusive:
    # the rates chosen at the edge lost seeds to divergence)
    "r6_tuned_sgd": "inconclusive",
    "r6_tuned_adam": "does not hold",
    # issue 19 (new, beyond): the wind tunnel with only W_Q, W_K slowed (0.1x), each rate tuned on
    # one seed kept apart: AdamW (3e-3) minus EM-style (base 3e-3) -0.017 +- 0.037 bits, 90%
    # interval -0.097 to 0.063 inside the margin 0.128: the same; SGD (0.3, backed off from the
    # edge) leaves the query stuck on every seed, 0.378 bits, interval -0.04 to 0.35: undecided.
    # Controls: the planted stuck query holds; AdamW's twin is not ahead (inconclusive)
    "r8_wt_em_adamw": "does not hold",
    "r8_wt_em_sgd": "inconclusive",
    "r8_wt_arms": "observation only",
    # issue 18 (new, beyond): the responsibility-normalized value step is 0.003 nats worse,
    # interval -0.005 to -0.000: within the no-effect band and below zero
    "beyond_mstep": "does not hold",
    # issue 17: judged on seeds 0, 1, 2: seeds 1 and 2 end at 0.38 bits, the 95% interval of the
    # mean spans both bars
    "r8_calibration": "inconclusive",
    "r8_calibration_larger_V": "does not hold",  # issue 18 (new, beyond): 0.30 ± 0.01 bits on a fixed budget
    "r8_kl": "inconclusive",  # issue 18 (new, beyond): as the entropy error, 0.25 ± 0.12 bits
    # issue 18: the frame head's matching pair tops the query's scores: dominance 0.24 ± 0.19,
    # interval across both bars (was 0.31 centred |cos| over all heads, "does not hold")
    "r8_keys": "inconclusive",
    "r8_keys_paper_i": "inconclusive",  # issue 18 (new): 2.0 ± 0.4 times random, interval across the bar
    # issue 18: entropy beyond position from the second layer's attention output, selectivity
    # 0.95 ± 0.02 (was |rho| of a positional coordinate, 0.36, "inconclusive")
    "r8_values": "holds",
    # issue 18: focusing at the query in the frame head, 0.22 ± 0.18 (was the entropy ratio over
    # value positions, whose ideal rises, "holds partly")
    "r8_focusing": "inconclusive",
    "r8_frame": "inconclusive",
    # issue 18: channels switched off by any path, the share of the gain undone, 0.12 and 0.12 with
    # intervals across the bars (was W_Q, W_K frozen, 54x / 1.8x, "holds partly")
    "r8_ablations": "inconclusive",
    "r9_ssm_exact": "holds",
    "r9_ssm_reference": "holds",
    "r9_attention_law": "holds",  # issue 18: an identity in parameter space (was 0.009, "holds partly")
    # issue 18: the row-mass channel carries 0.54 ± 0.04 of the SSM's routing step (0.77 at
    # initialization; was a difference of sign shares, -0.007, "inconclusive")
    "r9_ssm_law": "does not hold",
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
    exact = [r for r in rows if r["paper"] == "an exact identity"]  # closed forms against autograd
    assert exact and all(r["verdict"] == HOLDS for r in exact), exact
    found = {r["key"]: r["verdict"] for r in rows}
    assert set(EXPECTED_VERDICTS) == {c.key for c in CLAIMS}
    changed = {k: (EXPECTED_VERDICTS[k], v) for k, v in found.items() if v != EXPECTED_VERDICTS[k]}
    assert not changed, f"paper-scale verdicts changed (expected, found): {changed}"
