"""Key numbers a notebook records for the tests, the scorecard and its own text.

In a notebook::

    rec = Record(record_path)
    rec["max_rel_error"] = err          # glued for {glue:text}`max_rel_error:.1e`
    rec.save()                          # written atomically to record_path, if one is set

The runner passes ``record_path`` and adds the provenance (parameters, profile, commit,
and the computation paths the notebook ran).
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from ..files import write_json_atomic

_PACKAGE = __name__.rsplit(".", 2)[0]  # attention_dynamics

__all__ = ["Record", "to_jsonable"]


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
        """Write the values, the computation paths this process ran (compiled kernels or
        PyTorch, :func:`attention_dynamics.native.paths_taken`) and the stored models it used
        (:func:`attention_dynamics.artifacts.models_used`), which the runner files under the
        provenance."""
        if self.path is not None:
            # a process that never imported them ran no kernel and used no stored model:
            # importing them here would only cost a notebook without torch torch's import
            native, artifacts = (sys.modules.get(f"{_PACKAGE}.{m}") for m in ("native", "artifacts"))
            write_json_atomic(self.path, {"values": self.values, "paths": native.paths_taken() if native else {},
                                          "models": artifacts.models_used() if artifacts else []})


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
