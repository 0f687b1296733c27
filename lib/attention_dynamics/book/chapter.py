"""The first line of every chapter after its imports: the parameters checked against their
declaration, the book's figure style, and the record the runner collects."""
from __future__ import annotations

from ..plotting import use_style
from .parameters import check_declared
from .records import Record

__all__ = ["start_chapter"]


def start_chapter(chapter: str, namespace: dict, *keep: str) -> Record:
    """Check ``chapter``'s declared parameters in ``namespace`` (a notebook's ``globals()``,
    updated in place with the checked values), set the figure style, and return the
    chapter's :class:`Record` (written to ``namespace['record_path']`` when the runner set
    it) with the settings named in ``keep`` already recorded."""
    check_declared(chapter, namespace)
    use_style()
    rec = Record(namespace.get("record_path") or None)
    rec.keep(namespace, *keep)
    return rec
