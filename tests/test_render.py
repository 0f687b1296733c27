"""The verdicts are rendered when the book is built: a small Sphinx project with one chapter
page and its record, built twice. Changing the record (as a rule edit changes a verdict)
re-renders the page without anything being executed, and the page states what the record
says, not what it said before."""
from __future__ import annotations

import json

import pytest

from attention_dynamics.book.render import chapter_record, main, reading_text, summary_text

pytest.importorskip("myst_nb")

HOLDS_RECORD = {"r2_example_error": 0.0, "slopes_sv": [2.0, 2.001, 1.999]}
FAILS_RECORD = {"r2_example_error": 0.0, "slopes_sv": [1.0, 1.01, 0.99]}


def _write(path, values):
    path.write_text(json.dumps({"values": values, "provenance": {"profile": "quick"}}), encoding="utf-8")


def _project(tmp_path):
    src = tmp_path / "src"
    (src / "chapters").mkdir(parents=True)
    (src / "conf.py").write_text('extensions = ["myst_parser", "attention_dynamics.book.render"]\n'
                                 'myst_enable_extensions = ["colon_fence", "dollarmath"]\n'
                                 'exclude_patterns = ["chapters/*.json"]\n', encoding="utf-8")
    (src / "index.md").write_text("# Book\n\n```{toctree}\nchapters/value_law\nscorecard\n```\n", encoding="utf-8")
    (src / "scorecard.md").write_text("# Scorecard\n", encoding="utf-8")
    (src / "chapters" / "value_law.md").write_text(
        "# The value law\n\n```{claims-summary}\n```\n\nThe remainder falls with {reading}`slope_reading`.\n",
        encoding="utf-8")
    return src


def _build(src, out):
    from sphinx.cmd.build import build_main

    assert build_main(["-q", "-W", "-b", "html", str(src), str(out)]) == 0
    return (out / "chapters" / "value_law.html").read_text(encoding="utf-8")


def test_a_changed_record_rerenders_the_page(tmp_path):
    src = _project(tmp_path)
    _write(src / "chapters" / "value_law.json", HOLDS_RECORD)
    page = _build(src, tmp_path / "html")
    assert "the O(η²) of R4" in page and "Summary of this page" in page and "identity" in page
    assert "<strong>holds</strong>" in page and "does not hold" not in page
    _write(src / "chapters" / "value_law.json", FAILS_RECORD)  # the page's source is untouched
    page = _build(src, tmp_path / "html")
    assert "not the slope 2 of an O(η²) remainder" in page and "does not hold" in page


def test_a_missing_record_or_sentence_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no record .*value_law.json"):
        chapter_record(tmp_path / "value_law.json")
    (tmp_path / "bad.json").write_text("[1]", encoding="utf-8")
    with pytest.raises(ValueError, match="has no 'values' mapping"):
        chapter_record(tmp_path / "bad.json")
    with pytest.raises(KeyError, match="chapter 'value_law' has no sentence 'nope'"):
        reading_text("value_law", "nope", HOLDS_RECORD)
    with pytest.raises(KeyError, match="needs 'slopes_sv'"):
        reading_text("value_law", "slope_reading", {"r2_example_error": 0.0})


def test_the_command_line_prints_what_the_book_would_show(tmp_path, capsys):
    _write(tmp_path / "value_law.json", HOLDS_RECORD)
    assert main([str(tmp_path / "value_law.json")]) == 0
    out = capsys.readouterr().out
    assert summary_text("value_law", HOLDS_RECORD, "quick") in out and "slope_reading: the O(η²) of R4" in out
    assert main([str(tmp_path / "missing.json")]) == 2


def test_the_run_time_box_reads_its_times_from_the_records():
    from attention_dynamics.book.render import run_hint_text

    quick = {"seconds": 12.3, "profile": "quick", "threads": 1, "cpu": "CPU-A", "machine": "m", "cache_key": "q"}
    paper = {"seconds": 3385.0, "profile": "paper", "threads": 1, "cpu": "CPU-B", "machine": "m", "cache_key": "p"}
    box = run_hint_text("wt_laws", quick, paper)
    assert "ran in 12 s at the `quick` profile on 1 thread of an CPU-A" in box
    assert "`results/paper/wt_laws.json`) ran in 56 min at the `paper` profile" in box and "CPU-B" in box
    assert "--profile quick --only wt_laws" in box and "not counted" in box
    same = run_hint_text("wt_laws", paper, paper)  # the page is the committed run: said once
    assert same.count("56 min") == 1 and "results/paper/wt_laws.json" not in same
    assert "ran in" not in run_hint_text("wt_laws", {}, None)  # no time where no record gives one
