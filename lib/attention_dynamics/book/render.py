"""Verdicts rendered when the book is built, not when a chapter runs: a Sphinx extension
with a directive and a role that read a chapter's record (``chapters/NAME.json`` beside the
executed notebook) and judge it by today's rules.

- ```` ```{claims-summary} ```` : the chapter's summary box (:func:`summary_text`);
- ``{reading}`NAME``` : the sentence NAME of the chapter (:mod:`attention_dynamics.readings`);
- ```` ```{run-hint} ```` : how long the chapter ran (this build's record and, where the
  repository is beside the book, the committed paper record ``results/paper/NAME.json``)
  and how to run it at the quick profile (:func:`run_hint_text`).

A chapter records numbers and imports neither the claims nor the sentences, so its cache
key does not cover them: editing a rule or a sentence re-renders every page (each page
notes the record, the claims and the sentences as dependencies, which Sphinx rereads when
they change) and re-executes nothing. A reader who runs a notebook with papermill outside
the book sees the directive's source; ``python -m attention_dynamics.book.render
RECORD.json`` prints what the book would show.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["chapter_record", "cell", "summary_text", "reading_text", "run_hint_text", "setup", "main"]


def chapter_record(path: Path) -> tuple[dict, str]:
    """(values, profile) of a chapter's record, with an error that names the file."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no record {path}: run the chapter (python -m attention_dynamics.book) first") from None
    except ValueError as e:
        raise ValueError(f"the record {path} is not valid JSON ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("values"), dict):
        raise ValueError(f"the record {path} has no 'values' mapping")
    return record["values"], str(record.get("provenance", {}).get("profile", "?"))


def cell(text: str) -> str:
    """A markdown table cell: a literal | (as in |cos|) would end the cell."""
    return str(text).replace("|", "\\|")


def summary_text(chapter: str, values: dict, profile: str) -> str:
    """The summary box a chapter opens with: each of its claims, the paper's statement, our
    number with its uncertainty and the verdict, by the same rules as the scorecard."""
    from ..claims import evaluate
    from ..rules import BEYOND, IDENTITY, PAPER

    kind = {IDENTITY: "identity", PAPER: "paper", BEYOND: "beyond"}
    rows = [r for r in evaluate({chapter: {"values": values}}) if r["chapter"] == chapter]
    head = f"Summary of this page, computed from this run (profile `{profile}`)"
    if not rows:
        return (f":::{{admonition}} {head}\n:class: note\nNo claim of the paper is judged on this page; "
                "it measures the book's own implementation.\n:::\n")
    lines = [f":::{{admonition}} {head}", ":class: note", "",
             "| Claim | Kind | Paper | Ours | Verdict |", "|---|---|---|---|---|"]
    for r in rows:
        why = f" ({r['why']})" if r.get("why") else ""
        lines.append(f"| {r['result']}: {cell(r['quantity'])} | {kind[r['kind']]} | {cell(r['paper'])} | "
                     f"{cell(r['ours'])} | **{r['verdict']}**{cell(why)} |")
    lines += ["", "*Identity*: exact by construction, a check of the code and the algebra, not evidence for "
              "the paper. *Paper*: the paper's claim, tested empirically. *Beyond*: the book's own "
              "extension. The rule behind each verdict is on the page {doc}`../scorecard`.", ":::"]
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{seconds:.0f} s" if seconds < 120 else f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def _ran(prov: dict) -> str:
    threads = prov.get("threads", "?")
    return (f"{_duration(float(prov['seconds']))} at the `{prov.get('profile', '?')}` profile on {threads} "
            f"thread{'' if threads == 1 else 's'} of an {prov.get('cpu', 'unnamed processor')} ({prov.get('machine', '?')})")


def run_hint_text(chapter: str, prov: dict, paper_prov: dict | None) -> str:
    """The box that tells a reader what running the chapter costs: this build's time, the
    committed paper record's time (when it is another build) and the quick-profile command.
    Every time is read from a record's provenance."""
    lines = [":::{admonition} Running this chapter yourself", ":class: tip", ""]
    if "seconds" in prov:
        lines.append(f"This page ran in {_ran(prov)}.")
    if paper_prov and "seconds" in paper_prov and paper_prov.get("cache_key") != prov.get("cache_key"):
        lines.append(f"The committed paper-profile record (`results/paper/{chapter}.json`) ran in "
                     f"{_ran(paper_prov)}.")
    lines.append("These are the notebook's own seconds: a model it found already trained in the model "
                 "store (`~/.cache/attention_dynamics`) is not counted, so a first run, which trains "
                 "it, can take much longer.")
    lines += ["On a small machine, run it at the `quick` profile, from a clone of the repository:", "",
              "```bash", "python3 make.py book --profile quick  # every chapter, or one:",
              f".venv/bin/attention-book --profile quick --only {chapter} --out my-runs", "```", "",
              "or, in Jupyter, Colab or Binder, set the parameters of the first cells to the `quick:` "
              f"values for `{chapter}` in `notebooks/profiles.yml`; {{doc}}`../rerun` has the details.", ":::"]
    return "\n".join(lines) + "\n"


def reading_text(chapter: str, name: str, values: dict) -> str:
    from ..readings import sentence

    return sentence(chapter, name.strip(), values)


def _sources() -> list[str]:
    """The files whose edit changes what the directive and the role render: the claims, the
    sentences and every library module they import (the statistics behind the rules)."""
    from ..sources import module_closure

    return [str(p) for p in module_closure(["attention_dynamics.claims", "attention_dynamics.readings"])]


def _record_of(env) -> tuple[str, Path]:
    chapter = Path(env.docname).name
    return chapter, Path(env.srcdir) / f"{env.docname}.json"


def setup(app):
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective, SphinxRole

    def _load(env):
        chapter, path = _record_of(env)
        for dep in [str(path), *_sources()]:
            env.note_dependency(dep)
        values, profile = chapter_record(path)
        return chapter, values, profile

    class ClaimsSummary(SphinxDirective):
        has_content = False

        def run(self):
            chapter, values, profile = _load(self.env)
            text = summary_text(chapter, values, profile)
            box = nodes.container()
            self.state.nested_parse(StringList(text.splitlines()), self.content_offset, box)
            return box.children

    class Reading(SphinxRole):
        def run(self):
            chapter, values, _ = _load(self.env)
            try:
                return [nodes.Text(reading_text(chapter, self.text, values))], []
            except KeyError as e:
                msg = self.inliner.reporter.error(str(e), line=self.lineno)
                return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]

    class RunHint(SphinxDirective):
        has_content = False

        def run(self):
            chapter, path = _record_of(self.env)
            self.env.note_dependency(str(path))
            prov = json.loads(path.read_text(encoding="utf-8")).get("provenance", {})
            paper = Path(self.env.srcdir).parent / "results" / "paper" / f"{chapter}.json"
            paper_prov = None
            if paper.is_file():  # the repository beside the book: its committed paper record
                self.env.note_dependency(str(paper))
                paper_prov = json.loads(paper.read_text(encoding="utf-8")).get("provenance", {})
            box = nodes.container()
            text = run_hint_text(chapter, prov, paper_prov)
            self.state.nested_parse(StringList(text.splitlines()), self.content_offset, box)
            return box.children

    app.add_directive("claims-summary", ClaimsSummary)
    app.add_directive("run-hint", RunHint)
    app.add_role("reading", Reading())
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import re

    ap = argparse.ArgumentParser(prog="python -m attention_dynamics.book.render",
                                 description="Print a chapter's summary box and sentences from its record.")
    ap.add_argument("record", type=Path, help="NAME.json written beside an executed chapter")
    args = ap.parse_args(argv)
    try:
        values, profile = chapter_record(args.record)
    except (OSError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    chapter = args.record.stem.split("--")[0]
    print(summary_text(chapter, values, profile))
    notebook = Path(__file__).resolve().parents[3] / "notebooks" / f"{chapter}.ipynb"
    names = sorted(set(re.findall(r"\{reading\}`([^`]+)`", notebook.read_text()))) if notebook.is_file() else []
    for name in names:
        print(f"{name}: {reading_text(chapter, name, values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
