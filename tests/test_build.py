"""The built book's last check (book.build.check_html) on pages whose answer is known: a
resolved reference, as Sphinx writes it, passes; each kind of unresolved one, as Sphinx
writes it when it cannot find the target, and an error output, are named."""
from __future__ import annotations

from attention_dynamics.book.build import check_html

RESOLVED = ('<a class="reference internal" href="#fig-x"><span class="std std-numref">Fig. 1</span></a> '
            '<a class="reference internal" href="#equation-eq-r1">Eq. 1</a> '
            '<a class="reference internal" href="value_law.html"><span class="doc">The value law</span></a>')
UNRESOLVED = {
    "numref": '<code class="xref std std-numref docutils literal notranslate"><span class="pre">fig-missing</span></code>',
    "ref": '<span class="xref std std-ref">missing-label</span>',
    "eq": '<code class="xref eq docutils literal notranslate"><span class="pre">eq-missing</span></code>',
    "doc": '<span class="xref std std-doc">missing_page</span>',
    "role": '<span class="problematic" id="id1">{bogus}`x`</span>',
}


def test_resolved_references_pass_and_each_unresolved_kind_is_named(tmp_path):
    (tmp_path / "ok.html").write_text(f"<article>{RESOLVED}</article>")
    assert check_html(tmp_path) == []
    for kind, snippet in UNRESOLVED.items():
        (tmp_path / f"{kind}.html").write_text(f"<article>{RESOLVED} {snippet}</article>")
    bad = check_html(tmp_path)
    assert sorted(line.split(".html")[0] for line in bad) == sorted(UNRESOLVED)
    assert all("unresolved reference" in line for line in bad)


def test_an_error_output_is_named(tmp_path):
    (tmp_path / "page.html").write_text('<div class="output stderr">boom</div>')
    assert check_html(tmp_path) == ['page.html: contains \'class="output stderr"\'']
