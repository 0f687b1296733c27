"""Compiled kernels, built on the reader's machine on first use and cached.

A C compiler (``cc``, or ``$CC``) is all they need: the source is compiled for the feature
sizes at hand with :data:`COMMON_FLAGS` plus ``-march=native`` (without it, portably, where
the compiler rejects it) and loaded with ctypes. A caller always keeps a pure-PyTorch path,
taken when no kernel can be built, so nothing depends on a kernel being built.

Whether a kernel is the default path is decided per processor from committed measurements
(``speed.json``, written by ``benchmarks/kernel_choice.py --record``): see :func:`chooses`.
``ATTENTION_DYNAMICS_NATIVE=0`` turns every kernel off, ``=1`` on wherever it builds.

- ``causal_head.c``: the single causal head of the sticky-chain protocol, forward and
  closed-form backward fused per query (chapter *The sticky Markov chain: speed*).
- ``causal_attention.c``: causal softmax attention of many (batch, head) slices, forward and
  backward, for the transformer (:func:`attention_dynamics.transformer.causal_attention`).
- ``selective_scan.c``: the selective scan of the R9 SSM, forward and backward.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import torch

from ..files import replaced_atomically
from ..machine import cpu_info, cpu_model, processor_key

__all__ = ["causal_head_kernel", "causal_attention_kernel", "selective_scan_kernel", "NativeUnavailable",
           "in_threads", "transposed_padded", "KERNELS", "chooses", "choice_reason", "planned_paths",
           "paths_taken", "dispatch", "recording", "COMMON_FLAGS", "MARGIN"]

HERE = Path(__file__).resolve().parent
# Not -ffast-math: linked into a shared library it turns on flush-to-zero and
# denormals-are-zero for the whole process (GCC before 13 links crtfastmath.o), and its
# -ffinite-math-only lets the compiler assume no NaN or infinity reaches a kernel. These are
# the parts of it that let loops over floats vectorize (sums in any order, no errno),
# none of which changes the floating-point mode or the handling of NaN and infinities.
COMMON_FLAGS = ["-O3", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
                "-fassociative-math", "-freciprocal-math", "-shared", "-fPIC"]
TARGETS = {"native": ["-march=native"], "portable": []}  # tried in this order
KERNELS = ("causal_head", "causal_attention", "selective_scan")
# A kernel becomes the default on a processor when it is at least this much faster than the
# PyTorch path there: a tie goes to the maintained path. Set before any measurement; 10% is
# above the spread of repeated timings of one build on one machine (about 5% here).
MARGIN = 1.10
SPEED_FILE = HERE / "speed.json"

_lock = threading.Lock()
_loaded: dict[tuple, ctypes.CDLL | NativeUnavailable] = {}
_taken: dict[str, str] = {}
_targets: dict[str, str] = {}
T = TypeVar("T")


class _BuildFailed(Exception):
    """The compiler ran and refused the source; the message is the end of its errors."""


class NativeUnavailable(RuntimeError):
    """No kernel: no compiler, a failed build, or ATTENTION_DYNAMICS_NATIVE=0."""


def _setting() -> str:
    value = os.environ.get("ATTENTION_DYNAMICS_NATIVE", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"ATTENTION_DYNAMICS_NATIVE must be 0 (PyTorch paths only), 1 (every kernel that "
                         f"builds) or unset (the measured choice per processor), got {value!r}")
    return value


def measurements() -> dict[str, dict[str, dict]]:
    """kernel -> processor key -> {"ratio": PyTorch time / kernel time, ...}, as committed
    (read once per process: the choice cannot change while a process runs)."""
    return _read_measurements(SPEED_FILE)


@functools.lru_cache(maxsize=None)
def _read_measurements(path: Path) -> dict[str, dict[str, dict]]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def choice_reason(name: str, processor: str | None = None) -> tuple[bool, str]:
    """Whether kernel ``name`` is the default path on ``processor`` (this one by default), and
    why: its measured ratio there against :data:`MARGIN`; on a processor never measured, the
    kernel only if it won by the margin on every processor measured (else the maintained
    PyTorch path)."""
    if name not in KERNELS:
        raise ValueError(f"name must be one of {', '.join(KERNELS)}, got {name!r}")
    setting = _setting()
    if setting == "0":
        return False, "kernels disabled (ATTENTION_DYNAMICS_NATIVE=0)"
    if setting == "1":
        return True, "kernels forced (ATTENTION_DYNAMICS_NATIVE=1)"
    processor = processor or processor_key()
    table = measurements().get(name, {})
    if processor in table:
        ratio = float(table[processor]["ratio"])
        verdict = ratio >= MARGIN
        return verdict, f"measured {ratio:.2f}x the PyTorch path on {processor} ({'>=' if verdict else '<'} {MARGIN})"
    wins = [float(m["ratio"]) >= MARGIN for m in table.values()]
    if wins and all(wins):
        return True, f"not measured on {processor}; faster by {MARGIN}x or more on all {len(wins)} processors measured"
    return False, f"not measured on {processor}; the kernel did not win on every processor measured"


def chooses(name: str) -> bool:
    """Whether the default path of kernel ``name`` is the kernel on this processor."""
    return choice_reason(name)[0]


def _compiler() -> str | None:
    """$CC if it names a program that exists, else cc or gcc on the PATH."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("cc") or shutil.which("gcc")


def planned_paths() -> dict[str, str]:
    """kernel -> "kernel" or "torch": the default path each computation takes here (a kernel
    that is chosen but cannot be built falls back to PyTorch at its first call)."""
    has_cc = _compiler() is not None
    return {n: "kernel" if chooses(n) and has_cc else "torch" for n in KERNELS}


def dispatch(name: str, requested: bool | None, fits: bool, kernel: Callable[[], T], fallback: Callable[[], T]) -> T:
    """``kernel()`` or the PyTorch ``fallback()``, and a note of which ran. ``requested``:
    True, the kernel (NativeUnavailable where it cannot be built); False, PyTorch; None, the
    choice for this processor (:func:`chooses`), falling back where the kernel does not build.
    ``fits``: whether the inputs are ones the kernel takes."""
    noted = fits and requested is None  # the machine's choice; an explicit request is the caller's
    if fits and (requested or (requested is None and chooses(name))):
        try:
            out = kernel()
        except NativeUnavailable:
            if requested:
                raise
        else:
            if noted:
                _taken[name] = _merge(_taken.get(name), f"kernel ({_targets.get(name, '?')})")
            return out
    if noted:
        _taken[name] = _merge(_taken.get(name), "torch")
    return fallback()


@contextlib.contextmanager
def recording():
    """The default paths taken inside the block, as a dict filled when it ends (what made a
    stored artifact: :func:`attention_dynamics.artifacts.load_or_make`)."""
    global _taken
    outer, _taken, seen = _taken, {}, {}
    try:
        yield seen
    finally:
        seen.update(_taken)
        for name, path in _taken.items():
            outer[name] = _merge(outer.get(name), path)
        _taken = outer


def _merge(before: str | None, now: str) -> str:
    return now if before in (None, now) else "mixed"


def paths_taken() -> dict[str, str]:
    """computation -> the default path this process has run it through so far (calls with
    an explicit ``compiled``/``native`` are left out): "kernel (native)" or "kernel
    (portable)" (the build target), "torch", or "mixed"; for a record's provenance."""
    return dict(sorted(_taken.items()))


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention_dynamics"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base
    except OSError:
        return Path(tempfile.gettempdir())


def _build(source: Path, defines: dict[str, int]) -> tuple[Path, str]:
    """The library built from ``source``: (its path, the target it was built for)."""
    cc = _compiler()
    if not cc:
        raise NativeUnavailable(f"no C compiler found ($CC = {os.environ['CC']!r} is not a program here)"
                                if os.environ.get("CC") else "no C compiler found (cc, gcc or $CC)")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"the C compiler {cc} does not run: {e}") from None
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    # -march=native: a library built for one processor may not run on another that
    # shares this cache folder (a home directory on several machines)
    machine = f"{cpu_model()} {cpu_info().get('flags', '')}"
    failures = []
    for target, target_flags in TARGETS.items():
        args = COMMON_FLAGS + target_flags + [f"-D{k}={v}" for k, v in sorted(defines.items())]
        key = hashlib.sha256(source.read_bytes() + headers
                             + " ".join([cc, *args, version, machine]).encode()).hexdigest()[:16]
        path = _cache_dir() / f"{source.stem}-{key}.so"
        if path.is_file():
            return path, target
        try:
            with replaced_atomically(path, mode=0o777) as tmp:
                done = subprocess.run([cc, *args, str(source), "-o", str(tmp), "-lm"], capture_output=True,
                                      text=True, timeout=300)
                if done.returncode != 0:
                    raise _BuildFailed(done.stderr.strip()[-300:])
            return path, target
        except (OSError, subprocess.SubprocessError, _BuildFailed) as e:
            failures.append(f"{target}: {e}")
    raise NativeUnavailable(f"{cc} failed to build {source.name} ({'; '.join(failures)})")


def _kernel(source: str, defines: dict[str, int], signatures: dict[str, list]) -> ctypes.CDLL:
    if _setting() == "0":
        raise NativeUnavailable("disabled by ATTENTION_DYNAMICS_NATIVE=0")
    key = (source, tuple(sorted(defines.items())))
    with _lock:
        if key not in _loaded:
            try:
                path, target = _build(HERE / source, defines)
                lib = ctypes.CDLL(str(path))
            except (NativeUnavailable, OSError) as e:
                _loaded[key] = NativeUnavailable(str(e))  # not again at every call
            else:
                for name, argtypes in signatures.items():
                    getattr(lib, name).argtypes = argtypes
                    getattr(lib, name).restype = None
                _targets[Path(source).stem] = target
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
