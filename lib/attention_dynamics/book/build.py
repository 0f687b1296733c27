"""The static HTML book: the claims scorecard from the chapters' records, Jupyter Book (1.x)
with warnings as errors, and a final check that no page shows an error."""
from __future__ import annotations

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


def check_html(html_dir: Path) -> list[str]:
    bad = []
    for page in sorted(Path(html_dir).rglob("*.html")):
        text = page.read_text(errors="replace")
        for marker in ERROR_MARKERS:
            if marker in text:
                bad.append(f"{page.relative_to(html_dir)}: contains {marker!r}")
    return bad
