"""Every chapter executed at the quick profile, with the claims it records asserted."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest


def identities_hold(chapter: str, values: dict) -> bool:
    """Every identity row of the chapter holds, judged by the claims' rules (the one home of
    their thresholds), and there is at least one."""
    from attention_dynamics.claims import CLAIMS
    from attention_dynamics.rules import HOLDS

    rows = [c for c in CLAIMS if c.chapter == chapter and c.kind == "identity"]
    return bool(rows) and all(c.read(values).verdict == HOLDS for c in rows)


def test_routing_law_chapter(quick_runs):
    v = quick_runs("routing_law")["values"]
    assert v["n_causal"] > 0 and v["n_padding"] > 0 and v["n_smooth_loss"] > 0  # every kind was drawn
    assert identities_hold("routing_law", v)  # R1-R3 closed forms equal autograd, by the claims' own rules
    assert v["max_row_sum_rel"] <= 1e-12  # rows of dL/ds sum to zero
    assert v["example_sign_agreement"] == 1.0  # sign rule on every visible entry
    assert v["example_max_abs_error"] <= 1e-14


def test_value_law_chapter(quick_runs):
    v = quick_runs("value_law")["values"]
    assert identities_hold("value_law", v)  # R2 exact, R4's remainder O(eta^2), by the claims' rules
    assert abs(v["slope_params_mean"] - 2) < 0.05  # the same for the step in the parameters
    assert 1.8 < v["slope_min"] and v["slope_max"] < 2.2
    assert v["first_order_rel_error_smallest_eta"] < 1e-3


def test_specialization_chapter(quick_runs):
    v = quick_runs("specialization")["values"]
    assert v["loss_end"] < 0.2 * v["loss_start"]
    assert v["entropy_end"] < v["entropy_start"] - 0.3  # attention sharpens
    assert v["si_end"] > v["si_start"] + 0.3  # values come to serve single clusters
    assert v["alignment_mean"] > 0.3  # value steps point along their users' error prototype
    # R1 through W_Q, W_K: better than chance at a small step; exact-ish on free scores
    assert v["agreement_small_eta"] > 0.6
    assert v["free_weighted_agreement_small_eta"] > 0.95
    # the whole run on every seed, head and free scores at the same states: shares of entries
    per_seed = [v[k] for k in ("agreement_run_per_seed", "weighted_run_per_seed", "free_agreement_run_per_seed",
                               "free_weighted_run_per_seed")]
    assert all(len(x) == len(v["agreement_seeds"]) == 3 and all(0 <= y <= 1 for y in x) for x in per_seed)
    # symmetry breaking: every run specializes, later for a smaller initial asymmetry
    assert v["n_specialized"] == v["n_symmetric_runs"]
    assert v["steps_per_decade"] > 2 * v["steps_per_decade_se"] and v["growth_rate_per_step"] > 0


def test_two_timescale_em_chapter(quick_runs):
    v = quick_runs("two_timescale_em")["values"]
    assert identities_hold("two_timescale_em", v)  # E-step and hard M-step, by the claims' rules
    assert v["hard_landing_error"] < 1e-13  # hard attention: 1/N_j step = responsibility-weighted mean
    assert v["soft_correction_formula_error"] < 1e-12
    assert v["fixed_point_distance_well_separated"] < 1e-6  # same fixed point when attention is nearly hard
    assert v["fixed_point_distance_overlapping"] > 0.1  # and measurably not when it is soft
    assert v["max_residual"] < 1e-4
    gd = [n for n in v["gd_iterations"].values() if n is not None]
    assert v["mstep_iterations"] is not None and gd and v["mstep_iterations"] <= min(gd)
    assert v["best_ratio"] > 1 and v["speedup_best_vs_1"] > 1.2  # faster values help, at the best ratio
    assert set(v["steps_per_seed_by_ratio"]) == set(v["sweep_table"])
    assert v["first_diverging_ratio"] >= v["best_ratio"]  # until they overshoot


def test_every_plan_makes_models_its_chapter_then_loads(quick_runs):
    """book.plans is a head start, not a second source: each model a plan made first must be
    one its chapter then loaded, and a planned chapter trains none itself. A plan whose
    settings drifted from its chapter's would make models nobody loads; one that missed a
    model would leave it to the chapter (the same numbers, but the chapter's task grows)."""
    from attention_dynamics.book.jobs import JobResult
    from attention_dynamics.book.plans import PLANNED, unused_planned

    for name in PLANNED:
        quick_runs(name)
        planned, failed = quick_runs.planned[name]
        assert planned and not failed, f"{name}: its plan made {planned}, and failed at {failed}"
        assert not unused_planned(JobResult(name, "ran", 0.0, quick_runs(name), planned)), name
        # with a follow-up, its plan names the rest of the models
        trained = [m["file"] for m in quick_runs(name)["provenance"]["models"] if not m["loaded"]]
        assert not trained, f"{name} trained {trained} itself: its plan missed them"


def test_every_number_glued_into_the_text_is_recorded(root, quick_runs):
    """Each {glue:text}`name` in a chapter's prose must be a number the chapter records,
    so that every number on a page traces to the notebook's computation."""
    import re

    import nbformat

    from attention_dynamics.book.profiles import load_profiles

    for name in load_profiles(root):
        nb = nbformat.read(root / "notebooks" / f"{name}.ipynb", as_version=4)
        prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        keys = set(re.findall(r"\{glue:text\}`([A-Za-z_][A-Za-z0-9_]*)", prose))
        values = quick_runs(name)["values"]
        missing = keys - set(values)
        assert not missing, f"{name}: glued but never recorded: {sorted(missing)}"
        not_scalar = sorted(k for k in keys if not isinstance(values[k], (int, float, str)))
        assert not not_scalar, f"{name}: glued values must be numbers or strings: {not_scalar}"


def test_sticky_chain_chapter(quick_runs):
    v = quick_runs("sticky_chain")["values"]
    assert abs(v["self_transition"] - 0.3498) < 5e-5  # the script's matrix, quirk included
    assert v["em_final_mean"] < v["sgd_final_mean"]  # the EM-style schedule is ahead
    assert len(v["sgd_final_per_seed"]) == len(v["em_final_per_seed"]) == len(v["reach_steps_per_seed"]) == v["n_seeds"]
    assert v["reach_steps_mean"] < v["n_steps"] and v["speedup"] > 1


def test_sticky_chain_beyond_chapter(quick_runs):
    v = quick_runs("sticky_chain_beyond")["values"]
    assert abs(v["floor_conditional_entropy"] - 1.8292) < 5e-5
    assert v["floor_conditional_entropy"] < v["floor_filter"] <= v["floor_x_only"] + 3 * v["floor_filter_se"]
    assert v["floor_filter"] < v["floor_uniform"]
    assert v["gap_filter_sgd"] > 0 and v["gap_filter_em"] > 0  # short training stays above the honest floor
    assert v["long_below_filter_on_train"]  # long training fits the training sequence below the floor
    assert v["long_test_best_em"] > v["long_filter_test"] and v["long_test_best_sgd"] > v["long_filter_test"]
    assert not v["mstep_diverged"]


def test_tuned_baselines_chapter(quick_runs):
    v = quick_runs("tuned_baselines")["values"]
    runs = set(v["n_tuning_runs"].values())
    assert len(runs) == 1 and runs.pop() == v["n_trials"]  # the same tuning budget for every method
    for method, lr in v["tuned_lr"].items():
        assert lr in v["grids"][method] and len(v["tuning_log_steps"][method]) == len(v["grids"][method])
    arms = set(v["tuned_lr"]) | {"protocol SGD", "protocol EM-style", "control: EM-style at half its rate",
                                 "control: EM-style twin"}
    assert set(v["sticky_test_steps_per_seed"]) == set(v["test_final_per_seed"]) == arms
    assert all(len(x) == len(v["test_seeds"]) for x in v["sticky_test_steps_per_seed"].values())
    assert all(math.log(8) > lv > f for lv, f in zip(v["levels_test"], v["filter_test_per_seed"]))
    if v["tuned_lr"]["SGD"] == v["protocol_lr"]:  # the same run twice: the same numbers
        assert v["test_final_per_seed"]["SGD"] == v["test_final_per_seed"]["protocol SGD"]
    assert set(v["cluster_test_steps_per_seed"]) == (arms - {"protocol SGD", "protocol EM-style"}) | {
        "chapter's ratio 1", "chapter's ratio 10"}
    for method, lr in v["cluster_tuned_lr"].items():
        assert lr in v["cluster_grids"][method]


def test_wt_tuned_chapter(quick_runs):
    v = quick_runs("wt_tuned")["values"]
    runs = set(v["n_tuning_runs"].values())
    assert len(runs) == 1 and runs.pop() == v["n_trials"] * len(v["tuning_seeds"])  # one budget for every method
    assert set(v["tuning_seeds"]).isdisjoint(v["test_seeds"])
    for method, lr in v["tuned_lr"].items():
        assert lr in v["grids"][method] and len(v["tuning_mean_kl"][method]) == len(v["grids"][method])
    assert v["grids"]["AdamW"] == v["grids"]["EM-style"]  # EM-style tunes its base rate on AdamW's grid
    arms = set(v["tuned_lr"]) | {"all but values slow", "control: AdamW twin"}
    assert set(v["wt_final_kl_per_seed"]) == arms
    assert v["wt_rates"]["all but values slow"] == v["tuned_lr"]["AdamW"]
    assert v["wt_rates"]["control: AdamW twin"] == pytest.approx(1.05 * v["tuned_lr"]["AdamW"])
    n = len(v["test_seeds"])
    assert len(v["wt_init_kl_per_seed"]) == len(v["wt_init_query_kl_per_seed"]) == n
    for arm, kl in v["wt_final_kl_per_seed"].items():  # training moves every arm toward the posterior
        assert len(kl) == n and all(k is None or k < k0 for k, k0 in zip(kl, v["wt_init_kl_per_seed"])), arm
    # the query, the position that needs the keys, starts further from the posterior than the average one
    assert all(q > k for q, k in zip(v["wt_init_query_kl_per_seed"], v["wt_init_kl_per_seed"]))


def test_sticky_chain_speed_chapter(quick_runs):
    v = quick_runs("sticky_chain_speed")["values"]
    assert v["loss_agreement"] <= 1e-4  # the fast path computes the naive path's losses


def test_sticky_chain_deep_chapter(quick_runs):
    v = quick_runs("sticky_chain_deep")["values"]
    # it memorizes: below any fresh-data predictor on its training sequence, above the filter on fresh data
    assert v["train_loss_mean"] < v["filter_test_mean"] < v["test_loss_mean"] and v["memorizes"]
    assert v["gap_filter_mean"] > 0  # on fresh data never below the Bayes-optimal filter
    assert v["test_accuracy_mean"] < v["filter_accuracy_mean"] + 0.05  # nor more accurate than it


def test_wt_calibration_chapter(quick_runs):
    v = quick_runs("wt_calibration")["values"]
    assert v["mae_bits"] < v["mae_start_bits"]  # training moves the entropies toward the posterior
    assert v["n_seeds"] == len(v["mae_bits_per_seed"]) == len(v["query_error_bits_per_seed"]) == 2
    assert v["mae_bits_per_seed"][0] == v["mae_bits"] and v["query_error_bits_per_seed"][0] == v["query_error_bits"]
    assert isinstance(v["values_calibrated_step"], int)  # the counting positions calibrate within a short run


def test_wt_geometry_chapter(quick_runs):
    v = quick_runs("wt_geometry")["values"]
    assert v["mae_end"] < v["mae_start"]
    ratio = [a / u for a, u in zip(v["attention_bits_by_position"], v["uniform_bits_by_position"]) if u > 0]
    assert max(ratio) < 1  # attention below uniform causal attention at every position
    assert v["frame_comparisons"] == 3 * v["n_seeds"] == 3 * len(v["rho_mean_end_per_seed"])
    assert len(v["dominance_per_seed"]) == len(v["selectivity_attention_l1_per_seed"]) == v["n_seeds"]
    assert max(v["repeats_mae_bits_per_seed"]) < 1.0  # the repeated-keys runs learn something


def test_wt_laws_chapter(quick_runs):
    v = quick_runs("wt_laws")["values"]
    assert identities_hold("wt_laws", v)  # R1, R2 in situ and the probe's first order, by the claims' rules
    assert v["r2_max_error"] < 1e-5  # R2 holds exactly for the gradient inside the model (float32)
    assert v["sgd_value_alignment"] > 0  # a plain gradient step moves values along R2 on balance
    assert v["score_sign_agreement_eta_range"] < 0.02  # the probe is in its first-order regime


def test_ssm_routing_chapter(quick_runs):
    v = quick_runs("ssm_routing")["values"]
    assert identities_hold("ssm_routing", v)  # closed forms, mambapy, attention's laws coincide
    assert v["mambapy_max_rel_error_32"] <= 1e-5
    # a plain step on the SSM's routing parameters moves w with a non-negative inner
    # product with -b (dw = -eta J J^T b): the cosine cannot be negative beyond rounding
    assert v["ssm_cosine_b"] > -1e-6
    for arch in ("attention", "ssm"):
        assert 0.0 <= v[f"{arch}_weighted_advantage"] <= 1.0 and len(v[f"{arch}_weighted_b_per_seed"]) == 1


def test_inference_primitives_chapter(quick_runs):
    v = quick_runs("inference_primitives")["values"]
    for name in ("accumulation", "transport", "binding"):
        for arch in ("attention", "ssm"):
            # the Bayes predictor is the floor: no model beats it beyond the sampling noise
            assert min(v[f"{name}_{arch}_gap_per_seed"]) > -0.01, (name, arch)
    assert v["binding_bayes_bits"] == 0.0 and v["accumulation_bayes_bits"] < v["accumulation_baseline_bits"]
    # even 150 steps learn to count: both architectures capture most of the accumulation gain
    assert v["accumulation_attention_share"] > 0.5 and v["accumulation_ssm_share"] > 0.5
    assert abs(v["params_attention"] - v["params_ssm"]) <= 0.15 * v["params_ssm"]  # matched sizes


def test_scorecard_rows_come_from_the_records(root, quick_runs):
    from attention_dynamics.book.profiles import load_profiles
    from attention_dynamics.book.scorecard import render
    from attention_dynamics.claims import CLAIMS, evaluate
    from attention_dynamics.rules import VERDICTS

    chapters = load_profiles(root)
    assert {c.chapter for c in CLAIMS if c.chapter} <= set(chapters)
    rows = evaluate({name: quick_runs(name) for name in chapters})
    assert len(rows) == len(CLAIMS) and all(r["verdict"] in VERDICTS for r in rows)
    assert {r["result"] for r in rows} == {f"R{i}" for i in range(1, 10)}
    exact = [r for r in rows if r["kind"] == "identity"]
    assert exact and all(r["verdict"] == "holds" for r in exact)
    page = render(rows, {"x": "quick"})
    assert page.count("\n| R") == len(CLAIMS) and "{doc}`chapters/routing_law`" in page
    for part in page.split("\n## ")[1:]:  # each part's table: every row as many cells as its header
        rows_ = [l for l in part.splitlines() if l.startswith("|")]
        if rows_:
            assert all(l.replace("\\|", "").count("|") == rows_[0].count("|") for l in rows_), part[:40]


def test_every_chapter_opens_with_a_summary_rendered_from_its_record(root, quick_runs):
    """The summary box and the verdict sentences are not in the executed notebook: the book
    renders them from the record when it is built (attention_dynamics.book.render), so the
    chapter's cache key does not cover the rules. Every sentence a chapter names resolves
    from its quick record, and no output of the executed notebook states a verdict."""
    import re

    import nbformat

    from attention_dynamics.book.profiles import load_profiles
    from attention_dynamics.book.render import reading_text, summary_text
    from attention_dynamics.rules import VERDICTS

    for name in load_profiles(root):
        record = quick_runs(name)
        nb = nbformat.read(quick_runs.out_dir / f"{name}.ipynb", as_version=4)
        first_md = next(c for c in nb.cells if c.cell_type == "markdown")
        assert "```{claims-summary}" in first_md.source, name
        assert "Summary of this page" in summary_text(name, record["values"], "quick")
        prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        for reading in re.findall(r"\{reading\}`([^`]+)`", prose):
            assert reading_text(name, reading, record["values"]).strip(), (name, reading)
        outputs = str([c.outputs for c in nb.cells if c.cell_type == "code"])
        assert "Summary of this page" not in outputs, name
        assert not any(f"**{v}**" in outputs for v in VERDICTS), name


def test_no_chapter_imports_the_rules(root):
    """A rule or a sentence edited re-executes no chapter: neither module is among the
    files a chapter's cache key covers."""
    from attention_dynamics.sources import chapter_modules

    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        names = {p.name for p in chapter_modules(nb)}
        assert not names & {"claims.py", "rules.py", "readings.py"}, nb.stem


def test_outcome_sentences_follow_the_results(root, quick_runs, tmp_path):
    """Rerun a chapter with parameters that take its outcome away, and feed its record other
    outcomes: the rendered sentence and the summary's verdict change with them (no outcome
    is fixed text)."""
    from attention_dynamics.book.execution import execute
    from attention_dynamics.book.jobs import make_jobs
    from attention_dynamics.claims import verdicts
    from attention_dynamics.readings import sentence

    base = quick_runs("two_timescale_em")["values"]
    (job,) = make_jobs(root, "quick", only=["two_timescale_em"], out_dir=tmp_path,
                       overrides={"ratios": [1, 3000]})  # no ratio 10: the fixed ratio is not swept
    unswept = execute(job).record["values"]
    assert sentence("two_timescale_em", "ratio_reading", unswept).startswith("Faster values are not judged")
    assert verdicts("two_timescale_em", unswept)["r6_faster_values"] == "not measured"
    # ratio 10 three times faster on every seed, then three times slower
    faster = {**base, "steps_per_seed_by_ratio": {"1": [300.0, 330.0, 360.0], "10": [100.0, 105.0, 118.0]}}
    slower = {**base, "steps_per_seed_by_ratio": {"1": [100.0, 105.0, 118.0], "10": [300.0, 330.0, 360.0]}}
    assert sentence("two_timescale_em", "ratio_reading", faster).startswith("Faster values help")
    assert sentence("two_timescale_em", "ratio_reading", slower).startswith("Faster values do not help")
    assert "The two-timescale reading is not borne out" in sentence("two_timescale_em", "ratio_reading", slower)
    assert verdicts("two_timescale_em", faster)["r6_faster_values"] == "holds"
    assert verdicts("two_timescale_em", slower)["r6_faster_values"] == "does not hold"


def test_every_chapter_has_its_figures(root, quick_runs):
    """Each plt.show() of a chapter leaves a PNG in the executed notebook, even though the
    test process sets MPLBACKEND=Agg (the kernel must still draw inline)."""
    import nbformat

    from attention_dynamics.book.profiles import load_profiles

    assert os.environ.get("MPLBACKEND") == "Agg"
    for name in load_profiles(root):
        quick_runs(name)
        source = nbformat.read(root / "notebooks" / f"{name}.ipynb", as_version=4)
        shows = sum(c.source.count("plt.show()") for c in source.cells if c.cell_type == "code")
        done = nbformat.read(quick_runs.out_dir / f"{name}.ipynb", as_version=4)
        pngs = sum("image/png" in o.get("data", {}) for c in done.cells if c.cell_type == "code" for o in c.outputs)
        assert shows > 0 and pngs >= shows, f"{name}: {pngs} figures for {shows} plt.show() calls"


def _run_side_by_side(commands: list[tuple[list[str], Path]]) -> list:
    """Each (argument list, folder) run as a subprocess there, as many at a time as there are
    usable CPUs (each is one runner start-up, mostly one thread importing torch); the
    completed processes in the commands' order."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from attention_dynamics.book.scheduling import usable_cpus

    with ThreadPoolExecutor(max_workers=usable_cpus()) as pool:
        return list(pool.map(lambda c: subprocess.run(c[0], cwd=c[1], capture_output=True, text=True), commands))


def test_every_footer_command_runs_as_printed(root, quick_runs, tmp_path, monkeypatch):
    """Each chapter's provenance footer: the runner command, run as printed from a folder
    holding that build's outputs in my-runs/, finds the very run it describes (same
    parameters, same cache key: 'cached'); papermill's own parser reads the same
    parameters from the papermill command."""
    import json
    import shutil

    from attention_dynamics.book.profiles import load_profiles
    from support import footer_commands, papermill_parameters

    names = list(load_profiles(root))
    commands, pm_commands = [], {}
    for name in names:
        quick_runs(name)
        run_cmd, pm_commands[name] = footer_commands(quick_runs.out_dir / f"{name}.ipynb")
        work = tmp_path / name / "my-runs"
        work.mkdir(parents=True)
        for ext in ("ipynb", "json"):
            shutil.copy(quick_runs.out_dir / f"{name}.{ext}", work)
        assert run_cmd[0] == ".venv/bin/python" and run_cmd[-2:] == ["--out", "my-runs"]
        commands.append(([str(root / run_cmd[0]), *run_cmd[1:]], work.parent))
    for name, done in zip(names, _run_side_by_side(commands)):
        record = quick_runs(name)
        work = tmp_path / name / "my-runs"
        assert done.returncode == 0, (name, done.stderr[-2000:])
        assert f"[1/1] {name}: cached" in done.stdout, done.stdout
        assert json.loads((work / f"{name}.json").read_text()) == record
        expected = dict(record["provenance"]["parameters"], profile="quick")
        assert papermill_parameters(pm_commands[name], monkeypatch) == expected, name


def test_readme_rerun_examples_run_as_printed(root, tmp_path):
    """Each command of the README's section on rerunning a chapter, run as printed, each in a
    folder of its own (so that two at a time do not share my-runs/), writes its chapter's record."""
    import re
    import shlex

    readme = (root / "README.md").read_text()
    section = readme.split("## Rerun one chapter", 1)[1].split("\n## ", 1)[0]
    commands = [shlex.split(line) for block in re.findall(r"```bash\n(.*?)```", section, re.S)
                for line in block.splitlines() if line.startswith(".venv/bin/python")]
    assert len(commands) >= 2
    folders = [tmp_path / str(i) for i in range(len(commands))]
    for folder in folders:
        folder.mkdir()
    runs = _run_side_by_side([([str(root / cmd[0]), *cmd[1:]], f) for cmd, f in zip(commands, folders)])
    for cmd, folder, done in zip(commands, folders, runs):
        assert done.returncode == 0, (cmd, done.stderr[-2000:])
        only = cmd[cmd.index("--only") + 1]
        assert (folder / "my-runs" / f"{only}.json").is_file()


def test_the_pytorch_paths_give_every_chapter_the_same_claims(quick_runs, root):
    """The chapters that ran a compiled kernel here, run again with every kernel off
    (ATTENTION_DYNAMICS_NATIVE=0; by the quick book's process, right after the book): the same
    verdict for every claim and each claim's number within its tolerance (python -m
    attention_dynamics.book.compare). Trained numbers are not equal: a kernel and PyTorch
    round differently, and hundreds of float32 steps carry the difference on."""
    from attention_dynamics.book.compare import compare
    from attention_dynamics.book.profiles import load_profiles
    from quick_book import ran_a_kernel

    kernel = {name: quick_runs(name) for name in load_profiles(root)}
    used = sorted(n for n, r in kernel.items() if ran_a_kernel(r))
    runs = quick_runs.without_kernels()
    assert sorted(runs) == used
    if not used:
        pytest.skip("no kernel ran here (no compiler, or PyTorch is the faster path on this processor)")
    assert {p for r in runs.values() for p in r["provenance"]["paths"].values()} == {"torch"}
    result = compare({n: kernel[n] for n in used}, runs)
    print("\n".join(result.lines(30)))
    assert not result.failed, "\n".join(result.lines(30))
