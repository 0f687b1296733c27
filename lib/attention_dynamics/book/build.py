"""The static HTML book: the claims scorecard from the chapters' records, Jupyter Book (1.x)
with warnings as errors, and a final check that no page shows an error or a reference that
did not resolve."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

__all__ = ["build_book", "check_html"]


def build_book(book: Path) -> Path:
    """Write the claims scorecard from the chapters' records, run jupyter-book build
    (warnings are errors), then refuse pages that show an error. ``book``: the folder with
    _config.yml, _toc.yml, the pages and chapters/ (the executed notebooks)."""
    from .scorecard import write_scorecard

    book = Path(book)
    write_scorecard(book / "chapters", book / "scorecard.md")
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe), "build", str(book), "--builder", "html", "-W", "-n", "--keep-going", "--quiet"]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=book).returncode != 0:
        raise SystemExit("jupyter-book build failed (see the warnings above)")
    html = book / "_build" / "html"
    bad = check_html(html)
    if bad:
        raise SystemExit("built pages show errors:\n" + "\n".join(bad))
    return html


ERROR_MARKERS = ("Traceback (most recent call last)", "output error", "output traceback", 'class="output stderr"')
# what Sphinx leaves of a reference it could not resolve ({ref}, {doc}, {numref}, {eq}: the
# target's name in a span or code element of class "xref ..."; a resolved one is a link whose
# inner element has no "xref"), and docutils' mark of a role it could not parse
UNRESOLVED = re.compile(r'<(?:span|code) class="xref [^"]*"|class="problematic"')


def check_html(html_dir: Path) -> list[str]:
    """Every page that shows an error output or an unresolved reference, with what it shows."""
    bad = []
    for page in sorted(Path(html_dir).rglob("*.html")):
        text = page.read_text(errors="replace")
        for marker in ERROR_MARKERS:
            if marker in text:
                bad.append(f"{page.relative_to(html_dir)}: contains {marker!r}")
        bad += [f"{page.relative_to(html_dir)}: an unresolved reference {m.group(0)!r}"
                for m in UNRESOLVED.finditer(text)]
    return bad
