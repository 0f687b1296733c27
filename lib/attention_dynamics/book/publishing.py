"""After a paper build: its records copied to results/paper/ (committed, for CI), with the
claims that moved against the records there before; after a gpu build, to results/gpu/."""
from __future__ import annotations

from pathlib import Path

from .jobs import JobResult, results_folder
from ..files import write_json_atomic

__all__ = ["publish_paper_records", "trained_on_cuda"]


def trained_on_cuda(record: dict) -> bool:
    """Whether a record's provenance says its chapter trained on a CUDA device (the device
    the runner copies from the chapter's record, as :func:`attention_dynamics.devices.device_label`
    names it)."""
    return "CUDA" in str(record.get("provenance", {}).get("device", ""))


def publish_paper_records(root: Path, results: list[JobResult], profile: str = "paper") -> list[str]:
    """Copy the records of a paper build into results/paper/ (committed, so that CI checks
    paper-scale claims without the paper build) and say which claims changed beyond their
    tolerance, or changed verdict, against the records there before. ``profile``: the
    build's (:func:`attention_dynamics.book.jobs.results_folder` says where it goes)."""
    from .compare import compare
    from .scorecard import read_records

    folder = Path(root) / results_folder(profile)
    before = read_records(folder) if folder.is_dir() else {}
    after = {r.name: r.record for r in results}
    refused = []
    if profile == "gpu":  # a run that fell back to the CPU must not replace an accelerator's record
        refused = sorted(n for n, rec in after.items() if not trained_on_cuda(rec))
        after = {n: rec for n, rec in after.items() if n not in refused}
    for name, record in after.items():
        write_json_atomic(folder / f"{name}.json", record)
    lines = [f"{profile} records of {len(after)} chapter(s) written to {results_folder(profile)}/"]
    if refused:
        lines += [f"not written, since they did not train on a CUDA device: {refused}"]
    if before:
        lines += ["against the records there before (python -m attention_dynamics.book.compare):"]
        try:
            lines += compare({k: v for k, v in before.items() if k in after}, after).lines()
        except Exception as e:  # the records are written; a failed comparison must not hide that
            lines += [f"the comparison failed: {type(e).__name__}: {e}"]
    return lines
