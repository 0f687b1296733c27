"""The first cell of every chapter: on Colab, or anywhere the library is missing, it installs
the library (with the extras the chapter needs) from the one repository setting in
``book/_config.yml``; where the library is importable (the book's build, Binder, a clone) it
does nothing. ``ATTENTION_DYNAMICS_SOURCE`` overrides what is installed: a wheel, a fork, a
local checkout. ``python -m attention_dynamics.book.launch`` rewrites the cell of every
notebook after the setting changes; tests/test_launch.py fails until it has."""
from __future__ import annotations

from pathlib import Path

import nbformat

from ..sources import chapter_modules
from .provenance import repository

__all__ = ["INSTALL_TAG", "chapter_extras", "install_source", "install_cell", "sync_install_cells"]

INSTALL_TAG = "install"
# extras of pyproject.toml, each with the library module whose import needs it
EXTRA_OF_MODULE = {"ssm_reference": "ssm"}  # mambapy, the reference the SSM chapter checks against
# what each extra installs, by the name it is imported under: the cell installs where any
# is missing (a library installed without the extra would otherwise be left as it is)
EXTRA_IMPORTS = {"ssm": ("mambapy",)}


def chapter_extras(notebook: Path) -> list[str]:
    """The extras a chapter needs: those of the library modules it imports, transitively."""
    stems = {Path(m).stem for m in chapter_modules(notebook)}
    return sorted({extra for module, extra in EXTRA_OF_MODULE.items() if module in stems})


def install_source(repo: dict) -> tuple[str, str]:
    """The repository's address and branch, from book/_config.yml."""
    url, branch = str(repo.get("url", "")).rstrip("/"), repo.get("branch", "main")
    if not url.startswith("https://"):
        raise ValueError(f"book/_config.yml: repository.url must be an https address, got {url!r}")
    return url, branch


def install_cell_source(repo: tuple[str, str], extras: list[str]) -> str:
    requirement = "attention-dynamics" + (f"[{','.join(extras)}]" if extras else "")
    needed = ("attention_dynamics", *(m for e in extras for m in EXTRA_IMPORTS[e]))
    if len(needed) == 1:
        missing = f'importlib.util.find_spec("{needed[0]}") is None'
    else:
        missing = f"any(importlib.util.find_spec(m) is None for m in {needed!r})".replace("'", '"')
    return "\n".join([
        '# @title Install the library on Colab { display-mode: "form" }',
        "# Where attention_dynamics is missing (Colab, a bare kernel) this installs it;",
        "# elsewhere (the book's build, Binder, a clone) it does nothing.",
        "# ATTENTION_DYNAMICS_SOURCE overrides the source: a wheel, a fork, a checkout.",
        "import importlib.util",
        "import os",
        "import subprocess",
        "import sys",
        "from pathlib import Path",
        "",
        f'REPOSITORY = "{repo[0]}"',
        f'BRANCH = "{repo[1]}"',
        f'REQUIREMENT = "{requirement}"  # with the extras this chapter needs',
        f"if {missing}:",
        '    default = f"git+{REPOSITORY}@{BRANCH}"',
        '    source = os.environ.get("ATTENTION_DYNAMICS_SOURCE", default)',
        "    if Path(source).exists():  # a local wheel or checkout",
        "        source = Path(source).resolve().as_uri()",
        '    pip = [sys.executable, "-m", "pip", "install", "-q", f"{REQUIREMENT} @ {source}"]',
        "    subprocess.run(pip, check=True)",
        "    importlib.invalidate_caches()",
    ])


def install_cell(root: Path, notebook: Path) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(install_cell_source(install_source(repository(root)),
                                                         chapter_extras(notebook)))
    # folded in the book, in Jupyter and (through the form title) in Colab
    cell.metadata.update({"tags": ["hide-cell", INSTALL_TAG], "jupyter": {"source_hidden": True},
                          "cellView": "form"})
    return cell


def sync_install_cells(root: Path) -> list[str]:
    """Make the current install cell the first code cell of every notebook, right after its
    title; returns the notebooks changed."""
    changed = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        want = install_cell(root, path)
        at = [i for i, c in enumerate(nb.cells) if INSTALL_TAG in c.metadata.get("tags", [])]
        if at:
            have = nb.cells[at[0]]
            if have.source == want.source and have.metadata == want.metadata:
                continue
            want.id = have.id
            nb.cells[at[0]] = want
        else:
            want.id = "install"
            nb.cells.insert(1, want)
        nbformat.write(nb, path)
        changed.append(path.stem)
    return changed


if __name__ == "__main__":
    from .profiles import find_root

    print("rewrote:", ", ".join(sync_install_cells(find_root())) or "nothing")
