"""Trained models kept on disk between chapters, with their provenance.

Three wind-tunnel chapters measure the same baseline training run in different ways. The
first to ask for it trains it and stores what the others need (the model's and the
optimizer's states at the checkpoints, the loss curve); the others load it. An artifact is
found by a key over everything that determines it: its settings, PyTorch's version and the
library sources of the code that makes it (:func:`attention_dynamics.sources.module_closure`),
so an edit to the training code, or a new PyTorch, makes a new one; this module's own code is
not among them (it moves bytes: :data:`attention_dynamics.sources.PLUMBING`).

The folder is ``$ATTENTION_DYNAMICS_ARTIFACTS``, else ``~/.cache/attention_dynamics/artifacts``.
Chapters running side by side take a lock per artifact (``filelock``: an OS lock where the
system has one, a lock file elsewhere; ``ATTENTION_DYNAMICS_LOCK=file``, a lease file
created exclusively and refreshed by its holder, for a store on NFS): the second waits for the first to finish training and then
loads. The key also holds the computation paths of this processor
(:func:`attention_dynamics.native.planned_paths`): a kernel and PyTorch train to different
last digits, so a model trained one way is not loaded for the other. A file that does not load (truncated, from an older
format) is made again. Files are written whole or not at all.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from filelock import FileLock, SoftFileLease, Timeout

from .files import replaced_atomically
from .machine import cpu_model
from .native import planned_paths, recording
from .sources import module_closure, module_digest
from .store import store_folder

__all__ = ["artifact_folder", "load_or_make", "models_used", "STORE_FORMAT", "KEY_DIGITS"]


def artifact_folder() -> Path:
    """Where artifacts live (:func:`attention_dynamics.store.store_folder`), created."""
    base = store_folder()
    base.mkdir(parents=True, exist_ok=True)
    return base


# Raise by one when this module changes what a stored file holds or when it refuses to
# store one: its code is left out of the keys (sources.PLUMBING), so only this makes every
# model anew.
STORE_FORMAT = 1

# The models this process asked for, by file name: what a chapter's record says it used,
# so that a scheduler can tell how long the chapter takes where they are not stored yet.
_used: dict[str, dict] = {}


def models_used() -> list[dict]:
    """The stored models this process asked for: ``file`` (its name in the store), the
    ``seconds`` its training took wherever it was made, and whether this process ``loaded``
    it (else it trained it)."""
    return [dict(v, file=k) for k, v in sorted(_used.items())]


# a stored model's file is KIND-KEY.pt, KEY the first KEY_DIGITS hex digits of its key
KEY_DIGITS = 20
LEASE_SECONDS = 60.0  # a shared store's claim outlives its holder's last heartbeat by this long


@contextlib.contextmanager
def _held(lock_path: Path, kind: str):
    """This process alone, until the block ends; says so when it has to wait. With
    ATTENTION_DYNAMICS_LOCK=file, a lease file beside the model instead of an ``fcntl``
    lock (which some NFS set-ups do not honour): created exclusively, refreshed while its
    holder lives, and taken over LEASE_SECONDS after a holder died (on any machine); if a
    holder only stalls that long, two processes may both train the model, which costs time
    only (each renames a whole file into place)."""
    how = os.environ.get("ATTENTION_DYNAMICS_LOCK", "os")
    if how not in ("os", "file"):
        raise ValueError(f"ATTENTION_DYNAMICS_LOCK must be 'os' or 'file', got {how!r}")
    if how == "os":
        lock = FileLock(lock_path)
    else:  # its own file name: an fcntl lock's empty file left in the store must not block it
        lock = SoftFileLease(lock_path.with_suffix(".lease"), lease_duration=LEASE_SECONDS,
                             heartbeat_interval=LEASE_SECONDS / 4)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"{kind}: another process is making this artifact; waiting for it", file=sys.stderr, flush=True)
        lock.acquire(poll_interval=1.0)
    try:
        yield
    finally:
        lock.release()


def load_or_make(kind: str, settings: dict, make: Callable[[], Any], *, modules: list[str]) -> tuple[Any, dict]:
    """The artifact ``kind`` made with ``settings`` (JSON-serializable): loaded if it is on
    disk, else made by ``make()`` (anything ``torch.save`` stores with tensors, numbers,
    strings, lists and dicts) and stored. ``modules``: the dotted names of the library modules
    whose code makes it. Returns (payload, provenance); the provenance says what made it,
    when, on which processor, in how many seconds, and whether this call loaded it."""
    files = module_closure(modules)
    fields = {"kind": kind, "settings": settings, "torch": str(torch.__version__),
              "library_digest": module_digest(files), "paths": planned_paths()}
    if STORE_FORMAT > 1:  # format 1 is the key without the field: the models stored before it
        fields["store_format"] = STORE_FORMAT
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:KEY_DIGITS]
    folder = artifact_folder()
    path = folder / f"{kind}-{key}.pt"
    with _held(folder / f".{path.name}.lock", kind):
        if path.is_file():
            try:
                saved = torch.load(path, weights_only=True)
                payload, prov = saved["payload"], dict(saved["provenance"])
            except Exception as e:  # truncated by a crash of an older version, or unreadable
                print(f"{kind}: the stored artifact {path.name} does not load ({type(e).__name__}); "
                      f"making it again", file=sys.stderr, flush=True)
            else:
                # a model this process trained stays "trained here" when it is asked for again
                _used.setdefault(path.name, {"seconds": float(prov.get("seconds", 0.0)), "loaded": True})
                return payload, dict(prov, loaded=True, path=str(path))
        start = time.perf_counter()
        with recording() as taken:
            payload = make()
        prov = dict(fields, key=key, seconds=time.perf_counter() - start, cpu=cpu_model(),
                    threads=torch.get_num_threads(), paths_taken=taken,
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        unplanned = {n: p for n, p in taken.items() if p.split(" ")[0] != fields["paths"][n]}
        if unplanned:  # a planned kernel that did not build: stored, it would pass for the kernel's result
            print(f"{kind}: made through other computation paths than planned ({unplanned}); not stored",
                  file=sys.stderr, flush=True)
            return payload, dict(prov, loaded=False, path=None)
        with replaced_atomically(path) as tmp:
            torch.save({"payload": payload, "provenance": prov}, tmp)
        _used[path.name] = {"seconds": float(prov["seconds"]), "loaded": False}
        return payload, dict(prov, loaded=False, path=str(path))
