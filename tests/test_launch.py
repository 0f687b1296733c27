"""The first cell of every chapter (attention_dynamics.book.launch): it is the one the
current repository setting in book/_config.yml makes, and on a kernel without the library
(Colab's) it installs the library and the chapter runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from attention_dynamics.book import launch
from attention_dynamics.book.profiles import format_value, load_profiles
from attention_dynamics.book.provenance import repository

FIX = "run `python -m attention_dynamics.book.launch` to rewrite the install cells"


def _stale(config_root: Path, notebooks: Path) -> list[str]:
    """The notebooks under ``notebooks`` whose first code cell is not the install cell that
    ``config_root``/book/_config.yml makes, each with what is wrong."""
    wrong = []
    for path in sorted(notebooks.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        tagged = [i for i, c in enumerate(nb.cells) if launch.INSTALL_TAG in c.metadata.get("tags", [])]
        want = launch.install_cell(config_root, path)
        if tagged != code[:1]:
            wrong.append(f"{path.stem}: the install cell is not the one first code cell (tagged {tagged}, code {code[:1]})")
        elif (nb.cells[code[0]].source, nb.cells[code[0]].metadata) != (want.source, want.metadata):
            wrong.append(f"{path.stem}: the install cell differs from the one book/_config.yml makes")
    return wrong


def test_every_notebook_starts_with_the_install_cell_of_the_current_config(root):
    assert not _stale(root, root / "notebooks"), "\n".join(_stale(root, root / "notebooks") + [FIX])
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), path.stem
        assert launch.INSTALL_TAG in nb.cells[1].metadata.get("tags", []), f"{path.stem}: not right after the title"
    # the chapter that imports mambapy's reference asks for the extra that brings it
    assert launch.chapter_extras(root / "notebooks" / "ssm_routing.ipynb") == ["ssm"]
    assert launch.chapter_extras(root / "notebooks" / "value_law.ipynb") == []


def test_a_changed_repository_setting_fails_until_the_cells_are_rewritten(root, tmp_path):
    """The negative control of the test above: another branch in _config.yml makes every
    notebook stale, and sync_install_cells makes them current again."""
    (tmp_path / "book").mkdir()
    config = (root / "book" / "_config.yml").read_text()
    branch = launch.install_source(repository(root))[1]
    assert f"branch: {branch}" in config
    (tmp_path / "book" / "_config.yml").write_text(config.replace(f"branch: {branch}", "branch: a-fork-branch"))
    shutil.copytree(root / "notebooks", tmp_path / "notebooks")
    names = sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))
    assert len(_stale(tmp_path, tmp_path / "notebooks")) == len(names)
    assert sorted(launch.sync_install_cells(tmp_path)) == names
    assert _stale(tmp_path, tmp_path / "notebooks") == []
    assert launch.sync_install_cells(tmp_path) == []  # nothing left to rewrite
    cell = nbformat.read(tmp_path / "notebooks" / "value_law.ipynb", as_version=4).cells[1]
    assert 'BRANCH = "a-fork-branch"' in cell.source


# --- the Colab path, for real: a bare kernel, the wheel, one chapter ------------------------

CHAPTER = "value_law"  # the cheapest chapter


def _package_files(root: Path) -> set[str]:
    base = root / "lib"
    return {p.relative_to(base).as_posix() for p in (base / "attention_dynamics").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(root, tmp_path_factory) -> Path:
    """The library's wheel, built (no dependencies, no build isolation: the setuptools of
    this environment) from a copy of the sources, so that no build/ folder of the checkout
    with stale files goes into it."""
    src = tmp_path_factory.mktemp("wheel-src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(root / "lib", src / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True)
    (whl,) = out.glob("attention_dynamics-*.whl")
    return whl


def test_the_wheel_holds_every_file_of_the_package(root, wheel):
    """Everything a notebook reads at run time from the package (the parameter
    declarations, the C sources of the kernels, their measured speeds) is in the wheel."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    missing = sorted(_package_files(root) - names)
    assert not missing, f"files of the package that the wheel lacks (pyproject's package-data?): {missing}"
    assert "attention_dynamics/book/parameters.yml" in names
    (torch,) = [l for l in meta.splitlines() if l.startswith("Requires-Dist: torch")]
    assert ">=" in torch and "==" not in torch, f"the wheel must accept the torch a kernel has: {torch}"
    assert 'Provides-Extra: ssm' in meta and 'Requires-Dist: mambapy; extra == "ssm"' in meta


def _run(cmd, **kw):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_colab_path_fresh_venv_installs_the_wheel_and_runs_a_chapter(root, wheel, tmp_path):
    """SLOW (a virtual environment and pip installs; pip's cache is reused). What a Colab
    kernel has (torch, CPU build, and ipykernel; papermill to run it) in a fresh virtual
    environment without the library; the chapter's install cell, pointed at the wheel by
    ATTENTION_DYNAMICS_SOURCE, installs it with its dependencies beside that torch, and
    the chapter runs to its end at its quick parameters."""
    import torch

    started = time.monotonic()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "JUPYTER_PATH")}
    env.update(PATH=f"{py.parent}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), MPLBACKEND="Agg",
               JUPYTER_DATA_DIR=str(tmp_path / "jupyter"),  # no kernel of this machine's user
               ATTENTION_DYNAMICS_ARTIFACTS=str(tmp_path / "artifacts"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               # pip's --no-compile, for the kernel's packages and the install cell's alike: byte-compiling
               # every file of torch is half of the installs' time, and the chapter imports few of them
               # (pip reads a "no-" option's variable inverted: 0 turns compiling off)
               PIP_NO_COMPILE="0")
    bare = subprocess.run([str(py), "-c", "import attention_dynamics"], env=env, cwd=tmp_path, capture_output=True)
    assert bare.returncode != 0, "the library is importable in the fresh environment before the install cell ran"

    # the kernel's own packages: this environment's torch build (the CPU one, with its local
    # version label, so that pip cannot pick a CUDA build instead) and the pinned kernel
    lines = [l.split("#", 1)[0].strip() for l in (root / "requirements.txt").read_text().splitlines()]
    pins = dict(l.split("==", 1) for l in lines if "==" in l)
    kernel = [f"torch=={torch.__version__}", f"ipykernel=={pins['ipykernel']}", f"papermill=={pins['papermill']}"]
    _run([py, "-m", "pip", "install", "--quiet", *kernel], env=env, cwd=tmp_path)
    have = _run([py, "-m", "pip", "list", "--format=freeze"], env=env, cwd=tmp_path)
    assert not [l for l in have.splitlines() if l.lower().startswith("nvidia")], "a CUDA build of torch came in"
    assert f"torch=={torch.__version__}" in have.splitlines()

    params = dict(load_profiles(root)[CHAPTER]["quick"], profile="quick")
    out = tmp_path / f"{CHAPTER}.ipynb"
    _run([py.parent / "papermill", root / "notebooks" / f"{CHAPTER}.ipynb", out, "-k", "python3",
          "-y", format_value(params), "--cwd", tmp_path],
         env=dict(env, ATTENTION_DYNAMICS_SOURCE=str(wheel)), cwd=tmp_path)

    # the library came from the wheel, into this environment, beside the torch it found
    show = _run([py, "-m", "pip", "show", "attention-dynamics"], env=env, cwd=tmp_path)
    assert f"Location: {venv}" in show.replace(str(venv.resolve()), str(venv)), show
    origin = _run([py, "-c", "import importlib.metadata as m; "
                               "print(m.distribution('attention-dynamics').read_text('direct_url.json'))"],
                  env=env, cwd=tmp_path)
    assert wheel.resolve().as_uri() in origin, origin
    after = _run([py, "-c", "import torch; print(torch.__version__)"], env=env, cwd=tmp_path)
    assert after.strip() == torch.__version__, "the install replaced the kernel's torch"
    nb = nbformat.read(out, as_version=4)
    assert nb.cells[1].execution_count is not None and launch.INSTALL_TAG in nb.cells[1].metadata["tags"]
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    print(f"fresh-venv Colab path: {time.monotonic() - started:.0f} s")


def _run_install_cell(source: str, monkeypatch, missing: set[str]) -> list[list[str]]:
    """Execute an install cell with find_spec answering None for the modules in ``missing``
    and pip replaced by a recorder; the pip commands it would have run."""
    import importlib.util

    calls = []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    exec(compile(source, "<install cell>", "exec"), {})
    return calls


def test_the_install_cell_does_nothing_where_everything_is_importable_and_installs_what_is_missing(
        root, tmp_path, monkeypatch):
    ssm = launch.install_cell(root, root / "notebooks" / "ssm_routing.ipynb").source
    plain = launch.install_cell(root, root / "notebooks" / "value_law.ipynb").source
    assert _run_install_cell(ssm, monkeypatch, set()) == []  # the book's build, Binder, a clone
    assert _run_install_cell(plain, monkeypatch, set()) == []
    wheel = tmp_path / "attention_dynamics-0-py3-none-any.whl"
    wheel.write_bytes(b"")
    monkeypatch.setenv("ATTENTION_DYNAMICS_SOURCE", str(wheel))
    (cmd,) = _run_install_cell(ssm, monkeypatch, {"mambapy"})  # the library without its extra
    assert cmd[-1] == f"attention-dynamics[ssm] @ {wheel.resolve().as_uri()}"
    monkeypatch.delenv("ATTENTION_DYNAMICS_SOURCE")
    (cmd,) = _run_install_cell(plain, monkeypatch, {"attention_dynamics"})  # Colab
    url, branch = launch.install_source(repository(root))
    assert cmd[-1] == f"attention-dynamics @ git+{url}@{branch}"
