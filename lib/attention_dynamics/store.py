"""Where the trained-model store is and which models it holds, without loading anything:
the runner asks this before any chapter runs, so it imports no torch. The store itself (the
keys, the lock, loading and saving) is :mod:`attention_dynamics.artifacts`."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["store_folder", "missing_seconds"]


def store_folder() -> Path:
    """Where stored models live: $ATTENTION_DYNAMICS_ARTIFACTS, else the user's cache (not
    created here)."""
    env = os.environ.get("ATTENTION_DYNAMICS_ARTIFACTS")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention_dynamics" / "artifacts"


def missing_seconds(models) -> float:
    """The training seconds of those of ``models`` (as a chapter's record lists them:
    ``file``, ``seconds``, ``loaded``) whose files are not in the store now: what a chapter
    adds to its own time where they must be made. An entry that is not such a mapping counts
    nothing; a store that cannot be looked at counts every model as missing (the fresh-store
    estimate)."""
    folder = store_folder()
    total = 0.0
    for m in models if isinstance(models, list) else []:
        seconds = m.get("seconds") if isinstance(m, dict) else None
        if not isinstance(seconds, (int, float)) or not isinstance(m.get("file"), str):
            continue
        try:
            present = (folder / m["file"]).is_file()
        except OSError:
            present = False
        total += 0.0 if present else float(seconds)
    return total
