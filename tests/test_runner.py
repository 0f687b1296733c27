"""The runner: profiles, caching, failures that name the chapter and cell, atomic outputs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from pathlib import Path

import nbformat
import pytest

from attention_dynamics.book.profiles import load_profiles
from attention_dynamics.book.execution import execute
from attention_dynamics.book.jobs import NotebookFailed, make_jobs
from attention_dynamics.book.scheduling import run_jobs
from support import environ_restored, make_root

def test_profiles_select_parameters_and_record_provenance(tmp_path):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    (job,) = make_jobs(root, "quick", out_dir=out)
    r = execute(job)
    assert r.status == "ran" and r.record["values"] == {"double": 6}
    prov = r.record["provenance"]
    assert prov["profile"] == "quick" and prov["parameters"] == {"x": 3}
    assert "--only tiny" in prov["runner_command"] and "papermill notebooks/tiny.ipynb" in prov["papermill_command"]
    assert json.loads((out / "tiny.json").read_text())["values"] == {"double": 6}
    executed = nbformat.read(out / "tiny.ipynb", as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    (job,) = make_jobs(root, "paper", out_dir=out)
    assert execute(job).record["values"] == {"double": 10}


def test_unchanged_notebook_is_not_executed_again(tmp_path):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    first = run_jobs(make_jobs(root, "quick", out_dir=out), progress=False)
    again = run_jobs(make_jobs(root, "quick", out_dir=out), progress=False)
    assert [r.status for r in first] == ["ran"] and [r.status for r in again] == ["cached"]
    changed = run_jobs(make_jobs(root, "quick", out_dir=out, overrides={"x": 4}), progress=False)
    assert changed[0].status == "ran" and changed[0].record["values"] == {"double": 8}
    nb = root / "notebooks" / "tiny.ipynb"
    nb.write_text(nb.read_text().replace("2 * x", "2 * x + 0"))
    assert run_jobs(make_jobs(root, "quick", out_dir=out, overrides={"x": 4}), progress=False)[0].status == "ran"
    forced = make_jobs(root, "quick", out_dir=out, overrides={"x": 4}, force=True)
    assert run_jobs(forced, progress=False)[0].status == "ran"


def test_failure_names_chapter_and_cell_and_leaves_nothing(tmp_path):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    (job,) = make_jobs(root, "quick", out_dir=out, overrides={"fail": True})
    with pytest.raises(NotebookFailed, match=r"notebook 'tiny' failed in cell In\[\d+\]: ValueError: x is broken") as e:
        execute(job)
    assert e.value.name == "tiny" and e.value.ename == "ValueError"
    assert not out.exists() or list(out.iterdir()) == []


def test_failed_rerun_keeps_the_last_good_outputs(tmp_path):
    root = make_root(tmp_path)
    out = tmp_path / "out"
    (good,) = make_jobs(root, "quick", out_dir=out)
    execute(good)
    before = (out / "tiny.json").read_text()
    (bad,) = make_jobs(root, "quick", out_dir=out, overrides={"fail": True})
    with pytest.raises(NotebookFailed):
        execute(bad)
    assert (out / "tiny.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["tiny.ipynb", "tiny.json"]


def test_bad_parameters_and_names_are_refused(tmp_path):
    root = make_root(tmp_path)
    with pytest.raises(ValueError, match=r"chapter 'tiny' has no parameter\(s\) \['y'\]; its parameters are \['fail', 'offset', 'x'\]"):
        make_jobs(root, "quick", overrides={"y": 1})
    with pytest.raises(ValueError, match="set by the runner"):
        make_jobs(root, "quick", overrides={"record_path": "x"})
    with pytest.raises(ValueError, match=r"unknown chapter\(s\) \['nope'\]"):
        make_jobs(root, "quick", only=["nope"])
    with pytest.raises(ValueError, match="profile must be one of"):
        make_jobs(root, "huge")


def test_an_extra_profile_runs_only_the_chapters_that_have_it(tmp_path):
    """``gpu`` is a profile some chapters have: a build at it runs those alone, a chapter
    named without it is refused, its records are published to results/gpu/, and a profile
    no one knows is refused when the profiles file is read."""
    from attention_dynamics.book.jobs import JobResult, results_folder
    from attention_dynamics.book.publishing import publish_paper_records

    profiles = "tiny:\n  quick: {x: 3}\n  paper: {x: 5}\n  gpu: {x: 7}\nother:\n  quick: {x: 1}\n  paper: {x: 2}\n"
    root = make_root(tmp_path, profiles=profiles)
    shutil.copy(root / "notebooks" / "tiny.ipynb", root / "notebooks" / "other.ipynb")
    assert [j.name for j in make_jobs(root, "paper")] == ["tiny", "other"]
    (job,) = make_jobs(root, "gpu", out_dir=tmp_path / "out")
    assert job.name == "tiny" and job.parameters == {"x": 7}
    with pytest.raises(ValueError, match=r"chapter\(s\) \['other'\] have no 'gpu' profile; those that do: \['tiny'\]"):
        make_jobs(root, "gpu", only=["other"])
    r = execute(job)
    assert r.record["values"] == {"double": 14} and r.record["provenance"]["profile"] == "gpu"
    assert results_folder("gpu").as_posix() == "results/gpu" and results_folder("paper").as_posix() == "results/paper"
    with pytest.raises(ValueError, match="records are published for the profiles"):
        results_folder("quick")
    # a run that did not train on a CUDA device is not published at the gpu profile
    lines = publish_paper_records(root, [JobResult("tiny", "ran", 1.0, r.record)], "gpu")
    assert lines[1] == "not written, since they did not train on a CUDA device: ['tiny']"
    assert not (root / "results" / "gpu" / "tiny.json").exists()
    on_gpu = json.loads(json.dumps(r.record))
    on_gpu["provenance"]["device"] = "NVIDIA H100 80GB HBM3 (CUDA 13.0, torch 2.11.0)"
    lines = publish_paper_records(root, [JobResult("tiny", "ran", 1.0, on_gpu)], "gpu")
    assert lines == ["gpu records of 1 chapter(s) written to results/gpu/"]
    assert json.loads((root / "results" / "gpu" / "tiny.json").read_text())["values"] == {"double": 14}
    assert not (root / "results" / "paper").exists()
    # by default the gpu runs go beside the book's chapters, not over them
    (job,) = make_jobs(root, "gpu")
    assert Path(job.out_dir) == (root / "book" / "chapters-gpu").resolve()
    (root / "notebooks" / "profiles.yml").write_text(profiles + "  huge: {x: 9}\n")
    with pytest.raises(ValueError, match=r"chapter 'other' has the unknown profile\(s\) \['huge'\]"):
        make_jobs(root, "paper")


def test_missing_record_is_an_error(tmp_path):
    cells = [("code", 'record_path = ""\nprofile = "paper"\nx = 1', ["parameters"]), ("code", "y = x", [])]
    root = make_root(tmp_path, cells)
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out")
    with pytest.raises(NotebookFailed, match="saved no record"):
        execute(job)


def test_every_book_chapter_has_both_profiles_and_a_toc_entry(root):
    import yaml

    profiles = load_profiles(root)
    toc = (root / "book" / "_toc.yml").read_text()
    intro = (root / "book" / "intro.md").read_text()
    on_disk = {p.stem for p in (root / "notebooks").glob("*.ipynb")}
    assert on_disk == set(profiles), "every notebook must be registered in notebooks/profiles.yml"
    for name in profiles:
        assert f"chapters/{name}" in toc and f"chapters/{name}" in intro
        make_jobs(root, "quick", only=[name])  # parameters exist in the notebook
        make_jobs(root, "paper", only=[name])
    # the gpu profile: the calibration chapter at Paper I's size, its parameters checked too
    (gpu,) = make_jobs(root, "gpu")
    assert gpu.name == "wt_calibration" and gpu.parameters["wind_tunnel"]["V"] == 20
    assert yaml.safe_load(toc)["root"] == "intro"


def test_notebooks_are_stored_without_outputs(root):
    for path in (root / "notebooks").glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has stored outputs"
        assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1, path.name


def test_grid_runs_on_process_pool_and_dask(tmp_path):
    """A parameter grid through the runner on standard concurrent.futures executors:
    a local process pool, and a local Dask cluster's executor, with no code change."""
    from concurrent.futures import ProcessPoolExecutor

    from distributed import Client, LocalCluster

    from attention_dynamics.book.jobs import make_grid_jobs

    root = make_root(tmp_path)
    jobs = make_grid_jobs(root, "tiny", {"x": [1, 2, 3]}, out_dir=tmp_path / "pool")
    assert [j.stem for j in jobs] == ["tiny--x-1", "tiny--x-2", "tiny--x-3"]
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = run_jobs(jobs, pool, progress=False)
    assert [r.record["values"]["double"] for r in results] == [2, 4, 6]
    assert sorted(p.name for p in (tmp_path / "pool").iterdir()) == sorted(
        f"tiny--x-{i}.{ext}" for i in (1, 2, 3) for ext in ("ipynb", "json"))

    jobs = make_grid_jobs(root, "tiny", {"x": [4, 5], "fail": [False]}, out_dir=tmp_path / "dask")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        results = run_jobs(jobs, client.get_executor(), progress=False)
    assert [r.record["values"]["double"] for r in results] == [8, 10]
    assert all(r.record["provenance"]["parameters"]["x"] in (4, 5) for r in results)
    with pytest.raises(ValueError, match="grid must map parameter names to non-empty lists"):
        make_grid_jobs(root, "tiny", {"x": []})


def test_notebook_defaults_are_the_paper_profile(root):
    """Run by hand, a notebook reproduces the book's page: its parameter defaults are the
    paper profile."""
    import ast

    import papermill as pm

    for name, prof in load_profiles(root).items():
        params = pm.inspect_notebook(str(root / "notebooks" / f"{name}.ipynb"))
        for key, value in prof["paper"].items():
            default = ast.literal_eval(params[key]["default"])
            assert default == value, f"{name}.{key}: notebook default {default!r}, paper profile {value!r}"


def test_notebooks_read_like_the_book(root):
    """Short cells and lines a page can show (no horizontal scrolling), and a first screen
    that is the question and the math: the title cell first, then the install cell (for
    Colab), the parameters and every set-up cell before the first visible code cell collapsed."""
    hidden = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), path.name
        code = [c for c in nb.cells if c.cell_type == "code"]
        for i, c in enumerate(code):
            lines = c.source.splitlines()
            assert len(lines) <= 25, f"{path.name}: a code cell of {len(lines)} lines (at most 25)"
            wide = [l for l in lines if len(l) > 88]
            assert not wide, f"{path.name}: code lines wider than 88 characters: {wide}"
        first_visible = next(i for i, c in enumerate(code) if not hidden & set(c.metadata.get("tags", [])))
        assert "install" in code[0].metadata.get("tags", []), path.name
        assert "parameters" in code[1].metadata.get("tags", []) and first_visible >= 2, path.name
        assert all(hidden & set(c.metadata.get("tags", [])) for c in code[:first_visible]), path.name


def test_library_map_and_chapter_pointers(root):
    """The package docstrings are a map naming every module, and every chapter is named by
    the library functions or modules it explains."""
    import ast

    import attention_dynamics
    import attention_dynamics.book

    lib = root / "lib" / "attention_dynamics"
    maps = attention_dynamics.__doc__ + attention_dynamics.book.__doc__
    for p in lib.rglob("*.py"):
        if p.stem in ("__init__", "__main__"):
            continue
        name = p.relative_to(lib).with_suffix("").as_posix().replace("/", ".")
        assert name.split(".")[-1] in maps, f"the package map does not name {name}"
    docs = " ".join(" ".join((ast.get_docstring(n) or "").split()) for p in lib.rglob("*.py")
                    for n in ast.walk(ast.parse(p.read_text()))
                    if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)))
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        title = nbformat.read(path, as_version=4).cells[0].source.splitlines()[0].lstrip("# ").strip()
        assert f"*{title}*" in docs, f"no library docstring points to the chapter *{title}*"


def test_prose_is_not_part_of_a_modules_digest(tmp_path, monkeypatch):
    """A docstring, a comment or the layout changes no result: editing them leaves the
    digest (so the stored models and chapters) as it was; a changed statement, a changed
    string that is not a docstring, or a changed C source does not."""
    from attention_dynamics import sources

    package = tmp_path / "attention_dynamics"
    package.mkdir()
    monkeypatch.setattr(sources, "PACKAGE_DIR", package)
    mod, c = package / "m.py", package / "k.c"
    c.write_text("int f(void) { return 1; }\n")

    def digest(text):
        mod.write_text(text)
        return sources.module_digest([mod, c])

    base = digest('"""A module."""\nX = "a"\n\ndef f():\n    """Doc."""\n    return X\n')
    assert digest('"""Another map."""\n# why\nX = "a"\ndef f():\n    """Other."""\n\n    return X  # note\n') == base
    assert digest('X = "a"\n\ndef f():\n    return X\n') == base
    assert digest('"""A module."""\nX = "b"\n\ndef f():\n    """Doc."""\n    return X\n') != base
    assert digest('"""A module."""\nX = "a"\n\ndef f():\n    """Doc."""\n    return X + X\n') != base
    mod.write_text('"""A module."""\nX = "a"\n\ndef f():\n    """Doc."""\n    return X\n')
    c.write_text("int f(void) { return 2; }\n")
    assert sources.module_digest([mod, c]) != base


def test_an_edited_module_re_executes_only_the_chapters_that_import_it(tmp_path, monkeypatch):
    """The cache key covers the chapter's notebook, parameters and the library modules it
    imports, transitively: editing em.py re-executes the chapter that imports it (through
    another module's import too), not the one that does not; editing the runner, the
    scorecard page or the provenance footer re-executes neither."""
    from attention_dynamics import sources

    package = tmp_path / "pkg" / "attention_dynamics"
    shutil.copytree(sources.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sources, "PACKAGE_DIR", package)
    cells = lambda imp: [  # noqa: E731
        ("code", 'x = 1\nrecord_path = ""\nprofile = "paper"', ["parameters"]),
        ("code", f"{imp}\nfrom attention_dynamics.book.records import Record\nrec = Record(record_path)", []),
        ("code", "rec['double'] = 2 * x\nrec.save()", []),
    ]
    root = tmp_path / "repo"
    root.mkdir()
    make_root(root, cells("from attention_dynamics.em import em_step"), name="uses_em")
    nb = nbformat.read(root / "notebooks" / "uses_em.ipynb", as_version=4)
    for name, imp in (("uses_stats", "from attention_dynamics.stats import mean_std"),
                      ("uses_em_indirectly", "from attention_dynamics.specialization import cluster_usage")):
        nb.cells[1].source = f"{imp}\nfrom attention_dynamics.book.records import Record\nrec = Record(record_path)"
        nbformat.write(nb, root / "notebooks" / f"{name}.ipynb")
    (root / "notebooks" / "profiles.yml").write_text(
        "".join(f"{n}:\n  quick: {{x: 3}}\n  paper: {{x: 5}}\n" for n in ("uses_em", "uses_stats", "uses_em_indirectly")))
    assert package / "em.py" not in sources.chapter_modules(root / "notebooks" / "uses_stats.ipynb")
    out = tmp_path / "out"

    def statuses():
        return {r.name: r.status for r in run_jobs(make_jobs(root, "quick", out_dir=out), progress=False)}

    assert set(statuses().values()) == {"ran"}
    for f in ("book/execution.py", "book/scheduling.py", "book/scorecard.py", "book/provenance.py"):
        (package / f).write_text((package / f).read_text() + "\n_edited = True\n")
    assert set(statuses().values()) == {"cached"}
    # specialization imports laws, which imports head ... but not em: only uses_em re-runs
    (package / "em.py").write_text((package / "em.py").read_text() + "\n_edited = True\n")
    assert statuses() == {"uses_em": "ran", "uses_stats": "cached", "uses_em_indirectly": "cached"}
    (package / "head.py").write_text((package / "head.py").read_text() + "\n_edited = True\n")  # em, specialization use it
    assert statuses() == {"uses_em": "ran", "uses_stats": "cached", "uses_em_indirectly": "ran"}


def test_chapters_run_side_by_side_longest_first_with_one_thread_each(tmp_path, monkeypatch):
    """run_chapters: with two workers on two CPUs each kernel sees OMP_NUM_THREADS=1 (and
    PyTorch one thread), the chapter that took longest last time starts first, and the
    results come back in book order."""
    from support import make_root

    from attention_dynamics.book import scheduling, timetable
    from attention_dynamics.files import write_json_atomic

    cells = [("code", 'wait = 0.0\nrecord_path = ""\nprofile = "paper"', ["parameters"]),
             ("code", "import os, time\nimport torch\nfrom attention_dynamics.book.records import Record\n"
                      "rec = Record(record_path)\nrec['started'] = time.time()\ntime.sleep(wait)\n"
                      "rec['omp'] = os.environ.get('OMP_NUM_THREADS')\n"
                      "rec['torch_threads'] = torch.get_num_threads()\nrec.save()", [])]
    root = make_root(tmp_path, cells, name="short",
                     profiles="short:\n  quick: {wait: 0.0}\n  paper: {wait: 0.0}\n"
                              "long:\n  quick: {wait: 1.0}\n  paper: {wait: 1.0}\n"
                              "last:\n  quick: {wait: 0.0}\n  paper: {wait: 0.0}\n")
    for other in ("long", "last"):
        shutil.copy(root / "notebooks" / "short.ipynb", root / "notebooks" / f"{other}.ipynb")
    jobs = make_jobs(root, "quick", out_dir=tmp_path / "out")
    # the last run of "long" took longest: it is started first
    write_json_atomic(jobs[1].record, {"provenance": {"profile": "quick", "seconds": 99.0}})
    assert [scheduling.expected_seconds(j) for j in jobs] == [0.0, 99.0, 0.0]
    assert [j.name for j in scheduling.longest_first(jobs)] == ["long", "short", "last"]
    monkeypatch.setattr(scheduling, "usable_cpus", lambda: 2)
    results = scheduling.run_chapters(jobs, 2, progress=False)
    assert [r.name for r in results] == ["short", "long", "last"]
    assert all(r.record["values"]["omp"] == "1" and r.record["values"]["torch_threads"] == 1 for r in results)
    assert all(r.record["provenance"]["threads"] == 1 for r in results)
    table = timetable.timing_table(results, 3.0, 2)
    assert "share" in table and "wall clock" in table and "long" in table
    bounds = {line.split("  ")[0]: float(line.split()[2]) for line in table.splitlines() if line.startswith("bound:")}
    assert bounds["bound: longest"] == round(max(r.seconds for r in results), 1) >= 1.0  # "long" waited 1 s
    assert f"{sum(r.seconds for r in results) / 2:8.1f}  (executed now over 2 workers)" in table


def test_a_chapters_record_and_footer_say_which_stored_models_it_used(tmp_path, monkeypatch):
    store = tmp_path / "store"
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(store))
    from support import MODEL_CELLS

    root = make_root(tmp_path, MODEL_CELLS, name="uses_model")
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out")
    first = execute(job).record["provenance"]["models"]
    (made,) = first
    assert not made["loaded"] and made["file"].startswith("probe-") and (store / made["file"]).is_file()
    nb = nbformat.read(job.output, as_version=4)
    assert "| stored models | 1 trained here in " in nb.cells[-1].source
    job.output.unlink()  # run it again: now the model is loaded
    (loaded,) = execute(job).record["provenance"]["models"]
    assert loaded == dict(made, loaded=True)


def test_a_record_saved_without_the_store_or_a_kernel_imports_neither(tmp_path):
    """Record.save lists the stored models and kernels this process used, and does not
    import their modules (and torch with them) to learn that a process that never imported
    them used none. Positive side: the test above, a record that lists its model."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom attention_dynamics.book.records import Record\n"
            f"r = Record({str(tmp_path / 'r.json')!r})\nr['x'] = 1\nr.save()\n"
            "print(json.dumps(sorted(m for m in ('torch', 'attention_dynamics.artifacts', "
            "'attention_dynamics.native') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert json.loads((tmp_path / "r.json").read_text()) == {"values": {"x": 1}, "paths": {}, "models": []}


@pytest.mark.parametrize("workers", [1, 2])
def test_planned_models_are_made_first_and_their_chapter_loads_them(tmp_path, monkeypatch, capsys, workers):
    """book.plans: a chapter's models made as tasks of their own before it starts, once
    however many chapters plan them; a plan task that fails is left to its chapter, which
    makes the model itself."""
    import functools
    from concurrent.futures import ProcessPoolExecutor

    from support import MODEL_CELLS, make_probe_model

    from attention_dynamics.book.plans import ModelTask
    from attention_dynamics.book.scheduling import run_jobs

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path / "store"))
    root = make_root(tmp_path, MODEL_CELLS, name="a",
                     profiles="a:\n  quick: {x: 1}\n  paper: {x: 1}\nb:\n  quick: {x: 2}\n  paper: {x: 2}\n")
    shutil.copy(root / "notebooks" / "a.ipynb", root / "notebooks" / "b.ipynb")
    jobs = make_jobs(root, "quick", out_dir=tmp_path / "out")
    made = ModelTask("probe 1", functools.partial(make_probe_model, 1))
    broken = ModelTask("probe 2", functools.partial(make_probe_model, 2, fail=True))
    plans = {"a": [made, ModelTask("probe 1 again", functools.partial(make_probe_model, 1))], "b": [broken]}
    with ProcessPoolExecutor(workers) as pool:
        results = run_jobs(jobs, pool if workers > 1 else None, plans=plans)
    out = capsys.readouterr().out
    # made once (the second task of "a" is the same call), before its chapter
    assert out.count("[model ") == 2 and out.index("probe 1: made in") < out.index("] a: ran")
    assert "probe 2: failed (RuntimeError: this model cannot be made); its chapter will make it" in out
    a, b = (r.record["provenance"]["models"] for r in results)
    assert [m["loaded"] for m in a] == [True] and [m["loaded"] for m in b] == [False]
    assert results[0].planned == (a[0]["file"],) and results[1].planned == ()
    assert results[0].planned_failed == () and results[1].planned_failed == (broken.identity,)
    assert [r.record["values"]["x"] for r in results] == [1, 2]
    assert "warning" not in out


@pytest.mark.parametrize("workers", [1, 2])
def test_a_follow_up_plans_the_models_that_depend_on_the_first_ones(tmp_path, monkeypatch, capsys, workers):
    """book.plans.FOLLOW_UPS: models whose settings follow from results (here 10 x from the
    stored first model) are planned by a task once the first models exist, made, and then
    loaded by the chapter; a follow-up that fails leaves them to the chapter."""
    import functools
    from concurrent.futures import ProcessPoolExecutor

    from support import FOLLOW_CELLS, follow_probe, make_probe_model

    from attention_dynamics.book.plans import ModelTask
    from attention_dynamics.book.scheduling import run_jobs

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path / "store"))
    root = make_root(tmp_path, FOLLOW_CELLS, name="a",
                     profiles="a:\n  quick: {x: 3}\n  paper: {x: 3}\nb:\n  quick: {x: 4}\n  paper: {x: 4}\n")
    shutil.copy(root / "notebooks" / "a.ipynb", root / "notebooks" / "b.ipynb")
    jobs = make_jobs(root, "quick", out_dir=tmp_path / "out")
    plans = {n: [ModelTask(f"probe {x}", functools.partial(make_probe_model, x))] for n, x in (("a", 3), ("b", 4))}
    follow = {"a": functools.partial(follow_probe, 3), "b": functools.partial(make_probe_model, 0, fail=True)}
    with ProcessPoolExecutor(workers) as pool:
        a, b = run_jobs(jobs, pool if workers > 1 else None, plans=plans, follow_ups=follow)
    out = capsys.readouterr().out
    assert "[plan] a: 1 more model(s), from the first ones" in out
    assert "warning: b: its plan's follow-up failed (RuntimeError: this model cannot be made)" in out
    assert out.index("probe 30: made in") < out.index("] a: ran")
    assert [m["loaded"] for m in a.record["provenance"]["models"]] == [True, True] and len(a.planned) == 2
    assert sorted(m["loaded"] for m in b.record["provenance"]["models"]) == [False, True] and len(b.planned) == 1
    assert (a.record["values"]["y"], b.record["values"]["y"]) == (30, 40) and "warning: a" not in out


def test_the_time_table_counts_models_made_first_and_the_path_through_them():
    """Made-up results: a (2 s) after its model (5 s), b (6 s) with none; the critical path
    is a after its model, 7 s, not b's 6 s, and the even bound spreads all 13 s."""
    from attention_dynamics.book.jobs import JobResult
    from attention_dynamics.book.timetable import timing_table

    results = [JobResult("a", "ran", 2.0, {"provenance": {"seconds": 2.0, "threads": 1}}, ("m.pt",), (), (5.0,)),
               JobResult("b", "ran", 6.0, {"provenance": {"seconds": 6.0, "threads": 1}})]
    lines = {line.split("  ")[0]: line for line in timing_table(results, 9.0, 2).splitlines()}
    assert float(lines["1 models first"].split()[3]) == 5.0
    assert float(lines["executed now"].split()[2]) == 13.0
    assert float(lines["bound: longest"].split()[2]) == 7.0 and "after its longest model" in lines["bound: longest"]
    assert float(lines["bound: even"].split()[2]) == 6.5
    plain = timing_table([results[1]], 9.0, 1)  # no model made first: whole chapters
    assert "models first" not in plain and "the critical path of whole chapters" in plain


def test_a_worker_sets_the_threads_of_the_pytorch_it_inherited(monkeypatch):
    """A forked pool worker inherits the runner's PyTorch with its thread count set: a
    planned model made in the worker itself must use the worker's share of the CPUs."""
    import torch

    from attention_dynamics.book.scheduling import THREAD_VARIABLES, _use_threads

    before = torch.get_num_threads()
    for var in THREAD_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    try:
        torch.set_num_threads(2)
        _use_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_plan_that_drifted_from_its_chapter_is_named(tmp_path, monkeypatch, capsys):
    """The negative control of the plans' check: a plan made at other settings than its
    chapter's (x = 9 for a chapter at x = 1) makes a model the chapter does not load."""
    import functools

    from support import MODEL_CELLS, make_probe_model

    from attention_dynamics.book.plans import ModelTask, unused_planned
    from attention_dynamics.book.scheduling import run_jobs

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path / "store"))
    root = make_root(tmp_path, MODEL_CELLS, name="a", profiles="a:\n  quick: {x: 1}\n  paper: {x: 1}\n")
    (r,) = run_jobs(make_jobs(root, "quick", out_dir=tmp_path / "out"),
                    plans={"a": [ModelTask("probe 9", functools.partial(make_probe_model, 9))]})
    (made,) = r.planned
    assert unused_planned(r) == [made] and [m["loaded"] for m in r.record["provenance"]["models"]] == [False]
    assert f"warning: a: its plan made model(s) it did not load ({made})" in capsys.readouterr().out


def test_the_expected_time_adds_the_training_of_models_no_longer_stored(tmp_path, monkeypatch):
    """Ordering longest first must see that a chapter which loaded its models in 16 s
    takes their training time on a fresh store, and not count twice what it trained itself."""
    from attention_dynamics.book import scheduling
    from attention_dynamics.files import write_json_atomic

    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(store))
    (store / "kept.pt").write_bytes(b"x")
    root = make_root(tmp_path)
    (job,) = make_jobs(root, "quick", out_dir=tmp_path / "out")
    models = [{"file": "kept.pt", "seconds": 30.0, "loaded": False},  # trained in that run, still stored
              {"file": "gone.pt", "seconds": 500.0, "loaded": True},
              {"file": "kept-loaded.pt", "seconds": 70.0, "loaded": True}]
    write_json_atomic(job.record, {"provenance": {"profile": "quick", "seconds": 46.0, "models": models}})
    # its own 46 - 30 = 16 s, plus the two models not in the store: 500 + 70
    assert scheduling.expected_seconds(job) == 16.0 + 570.0
    (store / "gone.pt").write_bytes(b"x")
    (store / "kept-loaded.pt").write_bytes(b"x")
    assert scheduling.expected_seconds(job) == 16.0
    (store / "kept.pt").unlink()  # what that run trained, gone: counted once, not twice
    assert scheduling.expected_seconds(job) == 16.0 + 30.0
    # a damaged list counts what it can read; a record without one counts its seconds
    write_json_atomic(job.record, {"provenance": {"profile": "quick", "seconds": 46.0,
                                                  "models": models + ["junk", {"file": "y.pt"}]}})
    assert scheduling.expected_seconds(job) == 16.0 + 30.0
    write_json_atomic(job.record, {"provenance": {"profile": "quick", "seconds": 46.0, "models": "junk"}})
    assert scheduling.expected_seconds(job) == 46.0


def test_the_books_chapters_run_on_a_dask_cluster(tmp_path, capsys):
    """The whole book (here two chapters) through the runner's command line on a local
    Dask cluster, longest first, its records where a local run writes them."""
    from distributed import LocalCluster

    from attention_dynamics.book.cli import main

    root = make_root(tmp_path)
    shutil.copy(root / "notebooks" / "tiny.ipynb", root / "notebooks" / "other.ipynb")
    (root / "notebooks" / "profiles.yml").write_text(
        "tiny:\n  quick: {x: 3}\n  paper: {x: 5}\nother:\n  quick: {x: 7}\n  paper: {x: 9}\n")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        argv = ["--profile", "quick", "--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "out")]
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"2 chapters on the Dask cluster at {cluster.scheduler_address}" in out
    records = {n: json.loads((tmp_path / "out" / f"{n}.json").read_text()) for n in ("tiny", "other")}
    assert records["tiny"]["values"]["double"] == 6 and records["other"]["values"]["double"] == 14


def test_workers_started_with_the_nannys_malloc_trim_are_named_and_the_advice_removes_it():
    """A Dask nanny starts its worker with MALLOC_TRIM_THRESHOLD_ set (it slows training:
    benchmarks/dask_workers.py); the runner says so on connecting, and a cluster started
    with the environment variable it advises gets no warning."""
    import dask
    from distributed import Client, LocalCluster

    from attention_dynamics.book.scheduling import KEEP_GLIBC_DEFAULT, malloc_trim_warning

    def warning():
        with environ_restored(), \
                LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            return malloc_trim_warning(client)

    with pytest.MonkeyPatch.context() as mp:
        # Dask as it comes, whatever the shell running the tests has set
        mp.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
        mp.delenv(KEEP_GLIBC_DEFAULT[0], raising=False)
        dask.config.refresh()
        try:
            expected = dask.config.get("distributed.nanny.pre-spawn-environ")["MALLOC_TRIM_THRESHOLD_"]
            got = warning()
            assert f"1 of 1 Dask worker(s) started with MALLOC_TRIM_THRESHOLD_={expected} (tcp://" in got
            mp.setenv(*KEEP_GLIBC_DEFAULT)
            dask.config.refresh()
            assert warning() is None
            assert dask.config.get("distributed.nanny.pre-spawn-environ")["OMP_NUM_THREADS"] == 1  # kept
        finally:
            mp.undo()
            dask.config.refresh()
    # a fresh process (a `dask worker` command) reads the advice as it imports dask
    name, value = KEEP_GLIBC_DEFAULT
    code = "import dask, distributed; print(dask.config.get('distributed.nanny.pre-spawn-environ'))"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"} | {name: value}
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "'MALLOC_TRIM_THRESHOLD_': None" in fresh and "'OMP_NUM_THREADS': 1" in fresh


def test_a_cluster_that_cannot_say_gets_a_note_or_nothing_and_the_book_goes_on():
    """No worker yet (a batch queue's jobs join later): a note says nothing was checked; a
    worker that fails to answer: no warning, and no error."""
    from attention_dynamics.book.scheduling import malloc_trim_warning

    class Client:
        def __init__(self, answer):
            self.answer = answer

        def run(self, fn, on_error="raise"):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    assert malloc_trim_warning(Client({})).startswith("note: no Dask worker had connected yet")
    assert malloc_trim_warning(Client(OSError("closed"))) is None
    assert malloc_trim_warning(Client({"tcp://a": RuntimeError("closing"), "tcp://b": None})) is None
    many = malloc_trim_warning(Client({f"tcp://w{i}": "65536" for i in range(6)}))
    assert "6 of 6 Dask worker(s) started with MALLOC_TRIM_THRESHOLD_=65536 (tcp://w0, tcp://w1, tcp://w2, " \
           "tcp://w3 and 2 more)" in many


@pytest.mark.parametrize("threads", [1, 2])
def test_planned_models_go_to_a_dask_cluster_as_tasks(tmp_path, monkeypatch, capsys, threads):
    """On a Dask cluster of single-threaded workers, a chapter's planned model is a task of
    its own and the chapter loads it; with two threads a worker, two models made at once
    would share one process's generator, so the models are left to their chapters."""
    import functools

    from distributed import LocalCluster
    from support import MODEL_CELLS, make_probe_model

    from attention_dynamics.book import plans
    from attention_dynamics.book.scheduling import run_chapters

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path / "store"))
    root = make_root(tmp_path, MODEL_CELLS, name="a", profiles="a:\n  quick: {x: 4}\n  paper: {x: 4}\n")
    monkeypatch.setitem(plans.PLANNED, "a", lambda p: [plans.ModelTask(f"probe {p['x']}",
                                                                        functools.partial(make_probe_model, p["x"]))])
    with LocalCluster(n_workers=1, threads_per_worker=threads, processes=True, dashboard_address=None) as cluster:
        (r,) = run_chapters(make_jobs(root, "quick", out_dir=tmp_path / "out"), scheduler=cluster.scheduler_address)
    out = capsys.readouterr().out
    (model,) = r.record["provenance"]["models"]
    if threads == 1:
        assert "first 1 stored model(s) of 1 chapter(s), as tasks" in out and "[model 1/1] probe 4: made in" in out
        assert model["loaded"] and r.planned == (model["file"],)
    else:
        assert "a Dask worker runs 2 threads; the stored models are left to their chapters" in out
        assert not model["loaded"] and r.planned == () and "[model" not in out


def test_each_chapter_is_reported_as_it_finishes(tmp_path, monkeypatch):
    """On an executor, a short chapter's line is printed when it ends, not when the longest
    one does (waiting for the first exception would hold every line to the end)."""
    import time
    from concurrent.futures import ProcessPoolExecutor

    from support import make_root

    from attention_dynamics.book import dispatch, scheduling

    cells = [("code", 'wait = 0.0\nrecord_path = ""\nprofile = "paper"', ["parameters"]),
             ("code", "import time\nfrom attention_dynamics.book.records import Record\n"
                      "time.sleep(wait)\nRecord(record_path).save()", [])]
    root = make_root(tmp_path, cells, name="quick_one",
                     profiles="quick_one:\n  quick: {wait: 0.0}\n  paper: {wait: 0.0}\n"
                              "slow_one:\n  quick: {wait: 8.0}\n  paper: {wait: 8.0}\n")
    shutil.copy(root / "notebooks" / "quick_one.ipynb", root / "notebooks" / "slow_one.ipynb")
    reported = {}
    monkeypatch.setattr(dispatch, "report", lambda i, total, r: reported.setdefault(r.name, time.perf_counter()))
    jobs = make_jobs(root, "quick", out_dir=tmp_path / "out")
    with ProcessPoolExecutor(max_workers=2) as pool:
        scheduling.run_jobs(jobs, pool)
    assert reported["slow_one"] - reported["quick_one"] > 4.0  # the slow one slept 8 s longer


POOL_AFTER_A_USED_LOOP = """
import asyncio, gc, multiprocessing, signal, sys
from concurrent.futures import ProcessPoolExecutor
from jupyter_core.utils import run_sync
from attention_dynamics.book import scheduling

def kept(threads):
    pass

def job(alarm_s):
    signal.alarm(alarm_s)
    got = run_sync(asyncio.to_thread)(lambda: 7)
    gc.collect()  # an inherited loop left to the collector would be closed now
    return got

run_sync(asyncio.to_thread)(lambda: None)  # the runner's loop (jupyter_core's, kept per thread) used its executor
start = scheduling._use_threads if sys.argv[1] == "fresh" else kept
with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"), initializer=start, initargs=(1,)) as pool:
    try:
        print(pool.submit(job, int(sys.argv[2])).result(timeout=120))
    except Exception as e:
        print(type(e).__name__)
signal.alarm(60)
print("runner", run_sync(asyncio.to_thread)(lambda: 8))  # the runner's own loop still wakes from its threads
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the local pool forks its workers on Linux")
@pytest.mark.parametrize("start, alarm_s, printed", [("fresh", 60, "7"), ("kept", 3, "BrokenProcessPool")])
def test_a_pool_worker_starts_with_a_fresh_event_loop(start, alarm_s, printed):
    """A worker forked after the runner's loop had used its default executor: started as the
    runner starts its workers (scheduling._use_threads), a call to the executor returns, and
    the runner's own loop still works after the pool (a worker that closed the inherited loop
    broke it). The negative control keeps the inherited loop: the call waits until the alarm
    kills the worker, and the pool breaks."""
    done = subprocess.run([sys.executable, "-c", POOL_AFTER_A_USED_LOOP, start, str(alarm_s)], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == [printed, "runner", "8"], done.stdout + done.stderr[-3000:]
