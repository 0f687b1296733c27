"""Each chapter's parameters declared once (book/parameters.yml) and checked from there: the
declarations cover every notebook's parameters cell, both profiles of every chapter lie
inside them, and a value outside a declared range is refused by name, by the notebook's
check and by the runner."""
from __future__ import annotations

from pathlib import Path

import papermill as pm
import pytest

from attention_dynamics.book.jobs import make_jobs
from attention_dynamics.book.parameters import (check_declared, check_values, declaration_problems, declarations,
                                                 declared_chapters)
from attention_dynamics.book.profiles import RUNNER_PARAMETERS, load_profiles

ROOT = Path(__file__).resolve().parents[1]


def test_every_chapter_and_every_parameter_is_declared():
    profiles = load_profiles(ROOT)
    assert declared_chapters() == list(profiles)  # the same chapters, in book order
    for name in profiles:
        cell = set(pm.inspect_notebook(str(ROOT / "notebooks" / f"{name}.ipynb"))) - set(RUNNER_PARAMETERS)
        assert set(declarations(name)) == cell, name


def test_both_profiles_and_the_notebooks_defaults_lie_inside_the_declarations():
    for name, profiles in load_profiles(ROOT).items():
        for values in profiles.values():
            assert check_values(name, values).keys() == values.keys()
        defaults = {k: eval(v["default"]) for k, v in pm.inspect_notebook(  # noqa: S307 (our literals)
            str(ROOT / "notebooks" / f"{name}.ipynb")).items() if k not in RUNNER_PARAMETERS}
        check_values(name, defaults)


@pytest.mark.parametrize("chapter, values, message", [
    ("routing_law", {"seed": -1}, r"seed must be an integer in \[0, 2147483647\], got -1"),
    ("value_law", {"eta_min": 1e-3, "eta_max": 1e-4}, r"eta_max must be a finite number in \(0.001, 1\]"),
    ("specialization", {"n_steps": 100, "n_probes": 101}, r"n_probes must be an integer in \[1, 100\]"),
    ("ssm_routing", {"task": "sorting"}, "task must be one of"),
    ("wt_tuned", {"slow": 1.0}, r"slow must be a finite number in \(0, 1\)"),
    ("two_timescale_em", {"separations": [2.0]}, "separations must be a list of at least 2"),
    ("wt_laws", {"wind_tunnel": [8, 7]}, "wind_tunnel must be a mapping of settings"),
    # a bound written 1.0e+6: YAML 1.1 reads 1.0e6 as a string, which left it open
    ("two_timescale_em", {"ratios": [1.0, 2.0e6]}, r"ratios\[1\] must be a finite number in \[1, 1e\+06\]"),
])
def test_a_value_outside_its_declared_range_is_refused_by_name(chapter, values, message):
    with pytest.raises((TypeError, ValueError), match=message):
        check_values(chapter, values)


def test_the_notebooks_check_puts_back_the_checked_values_and_reads_bounds_from_the_namespace():
    ns = {"wind_tunnel": {}, "probe_every": 10, "probe_size": 4, "probe_lrs": [1e-3, 1e-1, 1e-2],
          "ablation_seeds": [1], "em_slow_scale": 0.1, "n_steps": 100}
    check_declared("wt_laws", ns)
    assert ns["probe_lrs"] == [1e-1, 1e-2, 1e-3]  # declared: largest first
    with pytest.raises(ValueError, match=r"probe_every must be an integer in \[1, 100\]"):
        check_declared("wt_laws", {**ns, "probe_every": 101})  # n_steps: not a parameter, in the namespace
    with pytest.raises(NameError, match="declares"):
        check_declared("wt_laws", {k: v for k, v in ns.items() if k != "probe_size"})


def test_the_runner_refuses_an_out_of_range_set_before_the_chapter_starts():
    with pytest.raises(ValueError, match="chapter 'routing_law': n_configs must be an integer"):
        make_jobs(ROOT, "quick", only=["routing_law"], overrides={"n_configs": 0})
    (job,) = make_jobs(ROOT, "quick", only=["routing_law"], overrides={"n_configs": 3})  # inside: accepted
    assert job.parameters["n_configs"] == 3


def test_the_tuned_chapters_seed_bound_leaves_room_for_the_held_out_sequences():
    from attention_dynamics.tuning import HELD_OUT

    for name in ("tuning_seeds", "test_seeds", "cluster_tuning_seeds", "cluster_test_seeds"):
        assert declarations("tuned_baselines")[name]["max"] == 2**31 - 1 - HELD_OUT, name


def _set_before_the_check(chapter: str) -> set[str]:
    """The names a chapter's notebook assigns before its start_chapter call (its parameters
    and what it derives from them, such as the wind tunnel's n_steps)."""
    import ast

    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / f"{chapter}.ipynb", as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    before = source[:source.index("start_chapter(")]
    before = before[:before.rfind("\n") + 1]
    return {n.id for n in ast.walk(ast.parse(before)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def test_every_declaration_is_well_formed_and_every_named_bound_exists():
    problems = [p for c in declared_chapters() for p in declaration_problems(c, declarations(c), _set_before_the_check(c))]
    assert not problems, problems
    assert "n_steps" in _set_before_the_check("wt_laws")  # the bound the notebook alone applies


def test_the_declaration_check_catches_a_typo():
    bad = {"a": {"type": "int", "max": "n_step"}, "b": {"type": "float", "opne": "low"},
           "c": {"type": "int", "open": "low"}, "d": {"type": "floats", "sorted": "ascending"}}
    problems = declaration_problems("x", bad, {"n_steps"})
    assert len(problems) == 4 and "'n_step'" in problems[0]
    assert len(declaration_problems("x", bad)) == 3  # without the notebook's names: no bound test


def test_a_malformed_declaration_file_is_refused_when_read(monkeypatch, tmp_path):
    from attention_dynamics.book import parameters

    bad = tmp_path / "parameters.yml"
    bad.write_text("ch:\n  n:\n    type: int\n    opne: low\n", encoding="utf-8")
    monkeypatch.setattr(parameters, "DECLARATIONS", bad)
    parameters._load.cache_clear()
    try:
        with pytest.raises(ValueError, match="ch.n: unknown key 'opne'"):
            parameters.declarations("ch")
    finally:
        parameters._load.cache_clear()
