"""Key numbers a notebook records for the tests, the scorecard and its own text.

In a notebook::

    rec = Record(record_path)
    rec["max_rel_error"] = err          # glued for {glue:text}`max_rel_error:.1e`
    rec.save()                          # written atomically to record_path, if one is set

The runner passes ``record_path`` and adds the provenance (parameters, profile, commit,
and the computation paths the notebook ran).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["Record", "to_jsonable", "write_json_atomic", "write_text_atomic"]


def to_jsonable(value: Any) -> Any:
    """Tensors, numpy scalars and arrays become plain Python; non-finite floats become None."""
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().numpy()
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):  # numpy
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"cannot record a value of type {type(value).__name__}")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename, so no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes files private (0600); give them an ordinary file's mode
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")


class Record:
    def __init__(self, path: str | os.PathLike | None = None, *, glue: bool = True):
        self.path = Path(path) if path else None
        self.values: dict[str, Any] = {}
        self._glue = glue

    def __setitem__(self, name: str, value: Any) -> None:
        if not name.isidentifier():
            raise ValueError(f"record names must be identifiers, got {name!r}")
        self.values[name] = to_jsonable(value)
        if self._glue and (isinstance(value, (int, float, str)) or hasattr(value, "item")):
            _glue(name, value)

    def keep(self, namespace: dict, *names: str) -> None:
        """Record (and glue) each named value of ``namespace`` (a chapter's ``globals()``)
        under its own name: the settings a chapter's text quotes."""
        for name in names:
            self[name] = namespace[name]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def save(self) -> None:
        """Write the values, and the computation paths this process ran (compiled kernels or
        PyTorch, :func:`attention_dynamics.native.paths_taken`), which the runner files
        under the provenance."""
        if self.path is not None:
            from ..native import paths_taken

            write_json_atomic(self.path, {"values": self.values, "paths": paths_taken()})


def _glue(name: str, value: Any) -> None:
    try:
        from IPython import get_ipython
        from myst_nb import glue
    except ImportError:
        return
    if get_ipython() is None:
        return
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return
    glue(name, value, display=False)
