"""Compiled kernels, built on the reader's machine on first use and cached.

A C compiler (``cc``, or ``$CC``) is all they need: the source is compiled with
``-O3 -march=native -ffast-math`` for the feature sizes at hand and loaded with ctypes. A
caller always keeps a pure-PyTorch path, taken when no compiler is found (or when
``ATTENTION_DYNAMICS_NATIVE=0``), so nothing depends on a kernel being built.

- ``causal_head.c``: the single causal head of the sticky-chain protocol, forward and
  closed-form backward fused per query (chapter *The sticky Markov chain: speed*).
- ``causal_attention.c``: causal softmax attention of many (batch, head) slices, forward and
  backward, for the transformer (:func:`attention_dynamics.transformer.causal_attention`).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..artifacts import cpu_info, cpu_model

__all__ = ["causal_head_kernel", "causal_attention_kernel", "selective_scan_kernel", "NativeUnavailable",
           "in_threads", "transposed_padded"]

HERE = Path(__file__).resolve().parent
FLAGS = ["-O3", "-march=native", "-ffast-math", "-std=gnu11", "-shared", "-fPIC"]
_lock = threading.Lock()
_loaded: dict[tuple, ctypes.CDLL | NativeUnavailable] = {}


class NativeUnavailable(RuntimeError):
    """No kernel: no compiler, a failed build, or ATTENTION_DYNAMICS_NATIVE=0."""


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention_dynamics"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base
    except OSError:
        return Path(tempfile.gettempdir())


def _build(source: Path, defines: dict[str, int]) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeUnavailable("no C compiler found (cc, gcc or $CC)")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"the C compiler {cc} does not run: {e}") from None
    args = FLAGS + [f"-D{k}={v}" for k, v in sorted(defines.items())]
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    # -march=native: a library built for one processor may not run on another that
    # shares this cache folder (a home directory on several machines)
    machine = f"{cpu_model()} {cpu_info().get('flags', '')}"
    key = hashlib.sha256(source.read_bytes() + headers
                         + " ".join([cc, *args, version, machine]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{key}.so"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([cc, *args, str(source), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise NativeUnavailable(f"{cc} failed to build {source.name}: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _kernel(source: str, defines: dict[str, int], signatures: dict[str, list]) -> ctypes.CDLL:
    if os.environ.get("ATTENTION_DYNAMICS_NATIVE", "1") == "0":
        raise NativeUnavailable("disabled by ATTENTION_DYNAMICS_NATIVE=0")
    key = (source, tuple(sorted(defines.items())))
    with _lock:
        if key not in _loaded:
            try:
                lib = ctypes.CDLL(str(_build(HERE / source, defines)))
            except (NativeUnavailable, OSError) as e:
                _loaded[key] = NativeUnavailable(str(e))  # not again at every call
            else:
                for name, argtypes in signatures.items():
                    getattr(lib, name).argtypes = argtypes
                    getattr(lib, name).restype = None
                _loaded[key] = lib
        found = _loaded[key]
    if isinstance(found, NativeUnavailable):
        raise found
    return found


_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def causal_head_kernel(d_k: int, n_classes: int) -> ctypes.CDLL:
    """The compiled causal-head kernel for these sizes (built once per machine and size);
    the number of classes must be a power of two, d_k at most 64."""
    if n_classes & (n_classes - 1) or not 1 <= d_k <= 64:
        raise NativeUnavailable(f"the kernel takes a power-of-two number of classes and d_k <= 64, "
                                f"got {n_classes} classes and d_k = {d_k}")
    return _kernel("causal_head.c", {"DK": d_k, "KP": 1 << (d_k - 1).bit_length(), "NC": n_classes},
                   {"causal_head_run": [_I, _I] + [_P] * 12 + [_I]})


def causal_attention_kernel(head_dim: int) -> ctypes.CDLL:
    """The compiled causal-attention kernel for this head dimension."""
    return _kernel("causal_attention.c", {"DH": head_dim},
                   {"attention_forward": [_I, _I, _I] + [_P] * 5 + [_F, _P],
                    "attention_backward": [_I, _I, _I] + [_P] * 10 + [_F, _P]})


def selective_scan_kernel(d_state: int) -> ctypes.CDLL:
    """The compiled selective scan (forward and backward) for ``d_state`` states per channel."""
    if not 1 <= d_state <= 256:
        raise NativeUnavailable(f"the scan kernel takes 1 to 256 states, got {d_state}")
    return _kernel("selective_scan.c", {"NS": d_state},
                   {"scan_forward": [_I, _I, _I] + [_P] * 7, "scan_backward": [_I, _I, _I] + [_P] * 13})


_POOLS: dict[int, ThreadPoolExecutor] = {}


def in_threads(fn, n_slices: int) -> None:
    """fn(start, stop) over ``n_slices`` independent slices, split evenly among torch's
    threads (the kernels run without the GIL)."""
    threads = max(1, min(torch.get_num_threads(), n_slices))
    if threads == 1:
        fn(0, n_slices)
        return
    with _lock:
        if threads not in _POOLS:
            _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="native")
        pool = _POOLS[threads]
    bounds = [n_slices * t // threads for t in range(threads + 1)]
    list(pool.map(lambda t: fn(bounds[t], bounds[t + 1]), range(threads)))


def transposed_padded(x: torch.Tensor, TP: int) -> torch.Tensor:
    """(S, T, D) -> (S, D, TP), zero beyond T: the layout in which the kernels walk keys."""
    out = x.new_zeros(x.shape[0], x.shape[2], TP)
    out[:, :, : x.shape[1]] = x.transpose(1, 2)
    return out
