"""Files written whole or not at all: the records, the stored models, the compiled kernels
and the scorecard are written to a temporary file beside their place and renamed into it,
so a reader (another chapter, a test, a second machine on a shared folder) never sees half
a file, and a crash leaves the old file or none."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

__all__ = ["replaced_atomically", "write_json_atomic", "write_text_atomic"]


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, *, mode: int = 0o666) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; when the block ends without
    an exception the file there becomes ``path`` in one rename, with ``mode`` less the umask
    (mkstemp makes files private; 0o777 for a shared library). On an exception it is
    removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        try:
            os.chmod(tmp, mode & ~_UMASK)
        except OSError:  # a file system without modes (some network mounts): the file still counts
            pass
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with replaced_atomically(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")
