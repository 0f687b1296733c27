"""After a paper build: its records copied to results/paper/ (committed, for CI), with the
claims that moved against the records there before."""
from __future__ import annotations

from pathlib import Path

from .jobs import RESULTS, JobResult
from ..files import write_json_atomic

__all__ = ["publish_paper_records"]


def publish_paper_records(root: Path, results: list[JobResult]) -> list[str]:
    """Copy the records of a paper build into results/paper/ (committed, so that CI checks
    paper-scale claims without the paper build) and say which claims changed beyond their
    tolerance, or changed verdict, against the records there before."""
    from .compare import compare
    from .scorecard import read_records

    folder = Path(root) / RESULTS
    before = read_records(folder) if folder.is_dir() else {}
    after = {r.name: r.record for r in results}
    for name, record in after.items():
        write_json_atomic(folder / f"{name}.json", record)
    lines = [f"paper records of {len(after)} chapter(s) written to {RESULTS}/"]
    if before:
        lines += ["against the records there before (python -m attention_dynamics.book.compare):"]
        try:
            lines += compare({k: v for k, v in before.items() if k in after}, after).lines()
        except Exception as e:  # the records are written; a failed comparison must not hide that
            lines += [f"the comparison failed: {type(e).__name__}: {e}"]
    return lines
