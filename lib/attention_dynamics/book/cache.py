"""When a chapter need not run again: its cache key (the notebook, its parameters and the
library modules it imports) and the checks that its last outputs can be trusted."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..sources import chapter_modules, module_digest
from .jobs import Job, JobResult

__all__ = ["library_digest", "cache_key", "cached_result", "file_digest"]


def library_digest(job: Job) -> str:
    """The SHA-256 of the library modules the chapter imports (transitively)."""
    return module_digest(chapter_modules(Path(job.notebook)))


def cache_key(job: Job) -> str:
    """Changes whenever the notebook's source, its parameters or a library module it
    imports (directly or through other modules) change, and on nothing else."""
    h = hashlib.sha256()
    h.update(Path(job.notebook).read_bytes())
    h.update(json.dumps({"profile": job.profile, "parameters": job.parameters}, sort_keys=True).encode())
    h.update(library_digest(job).encode())
    return h.hexdigest()


def _same_paths(taken: dict) -> bool:
    """Whether a record's computation paths are the ones this machine would take now (a
    kernel and PyTorch train to different last digits; the cache key, shared by every
    machine, does not cover them)."""
    from ..native import planned_paths

    if not isinstance(taken, dict):  # a record from before paths were recorded
        return False
    planned = planned_paths()
    return all(planned.get(name) == str(path).split(" ")[0] for name, path in taken.items())


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cached_result(job: Job, key: str) -> tuple[JobResult | None, str]:
    """The last run of ``job`` if it can be trusted: a record that parses as a dict with
    'values' and 'provenance' dicts, carries this cache key, and vouches (by its SHA-256)
    for the executed notebook beside it. Otherwise None and the reason, for the log."""
    if job.force:
        return None, ""
    if not (job.output.is_file() and job.record.is_file()):
        return None, ""
    try:
        record = json.loads(job.record.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            return None, "its record is not a JSON object"
        prov, values = record.get("provenance"), record.get("values")
        if not isinstance(prov, dict) or not isinstance(values, dict):
            return None, "its record lacks the 'values' or 'provenance' mapping"
        if prov.get("cache_key") != key:
            return None, ""  # changed since: the ordinary reason to run, nothing to report
        if prov.get("output_sha256") != file_digest(job.output):
            return None, "its executed notebook does not match the record (damaged or edited)"
        if not _same_paths(prov.get("paths")):
            return None, "it ran through other computation paths than this machine takes now (kernels or PyTorch)"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"its record cannot be read ({type(e).__name__})"
    return JobResult(job.stem, "cached", 0.0, record), ""
