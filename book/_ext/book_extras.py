"""Three fixes the browser check asked for, and the header's launch buttons:

- MathJax 3 is served from the installed django-static-mathjax package instead of a CDN,
  so the built book renders its math with no network;
- the inline script that sphinx-thebe registers twice (a JavaScript SyntaxError on every
  page: "THEBE_JS_URL has already been declared") is emitted once;
- the theme gets an explicit light/dark default, without which it logs a console error;
- the Binder and Colab buttons in a chapter's header open the chapter's source notebook,
  notebooks/NAME.ipynb of the configured branch, instead of the executed copy the page
  was built from (book/chapters/NAME.ipynb, not in git); other pages get none.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

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


CHAPTERS = "chapters/"  # where the runner puts the executed chapters, under the book


def _repository(app) -> dict:
    """The footer's repository setting, read once per build: the `repository` section of this
    book's _config.yml as it is written (the theme's copy would fill a missing branch with
    its own default)."""
    if not hasattr(app, "_book_repository"):
        config = yaml.safe_load((Path(app.srcdir) / "_config.yml").read_text()) or {}
        app._book_repository = config.get("repository") or {}
    return app._book_repository


def _launch_buttons(app, pagename, templatename, context, doctree):
    """Rewrite the theme's launch buttons (the header group labelled "launch-buttons", which
    sphinx-book-theme builds from ``launch_buttons`` and ``repository`` in _config.yml) to
    the addresses the chapter's provenance footer gives (provenance.launch_links, the one
    place that writes them); drop the group on pages that are not chapters."""
    from attention_dynamics.book.provenance import launch_links

    buttons = context.get("header_buttons") or []
    if not any(b.get("label") == "launch-buttons" for b in buttons):
        return
    links = launch_links(_repository(app), pagename.removeprefix(CHAPTERS)) if pagename.startswith(CHAPTERS) else {}
    kept = []
    for b in buttons:
        if b.get("label") == "launch-buttons":
            # each button is the theme's own (text, icon, tooltip), with the footer's address
            b = dict(b, buttons=[dict(x, url=links[x.get("text")]) for x in b.get("buttons", [])
                                 if x.get("text") in links])
            if not b["buttons"]:
                continue
        kept.append(b)
    context["header_buttons"] = kept


def setup(app):
    app.connect("config-inited", _set_path)
    app.connect("config-inited", _defaults)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.connect("html-page-context", _launch_buttons, priority=600)  # after the theme's (501)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
