"""Three fixes the browser check asked for:

- MathJax 3 is served from the installed django-static-mathjax package instead of a CDN,
  so the built book renders its math with no network;
- the inline script that sphinx-thebe registers twice (a JavaScript SyntaxError on every
  page: "THEBE_JS_URL has already been declared") is emitted once;
- the theme gets an explicit light/dark default, without which it logs a console error.
"""
from __future__ import annotations

import shutil
from pathlib import Path

TARGET = "mathjax"  # under _static


def _es5() -> Path:
    import mathjax  # the django-static-mathjax package: MathJax 3 under static/mathjax

    path = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (path / "tex-chtml.js").is_file():
        raise FileNotFoundError(f"MathJax's tex-chtml.js not found under {path}")
    return path


def _set_path(app, config):
    _es5()  # fail early, at configuration time, if the package is missing
    config.mathjax_path = f"{TARGET}/tex-chtml.js"


def _copy(app, exception):
    if exception is None and app.builder.format == "html":
        dest = Path(app.outdir) / "_static" / TARGET
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(_es5(), dest)


def _defaults(app, config):
    config.html_context = {"default_mode": "light", **(config.html_context or {})}


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # an asset is its file name and attributes (an inline script: None and its body)
        # (inline scripts arrive with a file name of None or "", depending on who added them)
        key = (getattr(script, "filename", script) or None, tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("config-inited", _set_path)
    app.connect("config-inited", _defaults)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
