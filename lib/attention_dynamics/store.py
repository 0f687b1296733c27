"""Where the trained-model store is and which models it holds, without loading anything:
the runner asks this before any chapter runs, so it imports no torch. The store itself (the
keys, the lock, loading and saving) is :mod:`attention_dynamics.artifacts`."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["store_folder", "recorded_models", "own_seconds", "missing_seconds"]


def store_folder() -> Path:
    """Where stored models live: $ATTENTION_DYNAMICS_ARTIFACTS, else the user's cache (not
    created here)."""
    env = os.environ.get("ATTENTION_DYNAMICS_ARTIFACTS")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention_dynamics" / "artifacts"


def recorded_models(value) -> list[dict]:
    """The well-formed entries of a chapter record's list of stored models
    (:func:`attention_dynamics.artifacts.models_used`: ``file``, ``seconds``, ``loaded``);
    anything else (a record from an older or damaged build) is left out."""
    if not isinstance(value, list):
        return []
    return [m for m in value if isinstance(m, dict) and isinstance(m.get("file"), str)
            and isinstance(m.get("seconds"), (int, float)) and isinstance(m.get("loaded"), bool)]


def own_seconds(provenance: dict) -> float:
    """A chapter's seconds in the run a record describes, without the training of the
    stored models it made in that run (what it takes where they are stored)."""
    made = sum(m["seconds"] for m in recorded_models(provenance.get("models")) if not m["loaded"])
    return max(float(provenance["seconds"]) - made, 0.0)


def missing_seconds(models) -> float:
    """The training seconds of those of ``models`` (a record's list, see
    :func:`recorded_models`) whose files are not in the store now: what a chapter adds to
    its own time where they must be made. A store that cannot be looked at counts every
    model as missing (the fresh-store estimate)."""
    folder = store_folder()
    total = 0.0
    for m in recorded_models(models):
        seconds = m["seconds"]
        try:
            present = (folder / m["file"]).is_file()
        except OSError:
            present = False
        total += 0.0 if present else float(seconds)
    return total
