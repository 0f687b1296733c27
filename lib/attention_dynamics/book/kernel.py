"""The kernel the runner executes chapters in: ipykernel, started as ``python -m
ipykernel_launcher`` starts it, then, before it answers, the libraries every chapter imports
loaded with the garbage collector off and their objects frozen out of its passes
(:func:`gc.freeze`).

Why: a chapter's kernel spent about 4 s before and after its own work at the quick profile:
2.3 s on the imports of its first cell, collections during the chapter that walked the
imported libraries' 300,000 objects again (0.14 s each), and 1.1 s to shut down, most of it
the collections of the interpreter's exit (``benchmarks/kernel_start.py`` measures each).
The libraries are the ones the chapter imports itself (numpy first, as it does), after
the kernel has set itself up as usual (its ports, its output streams, the inline backend,
the warnings filters, ``sys.path``), so a chapter sees what it sees in a plain kernel
(``tests/test_kernel.py`` compares the two). Not loaded: ``matplotlib.pyplot`` and seaborn,
which pick the backend the chapter selects.

What differs: a library that fails to load here is left to the chapter, whose own import
then fails in its cell (a crash of a native library as it loads, or an exit, now stops the
kernel before it answers: the runner starts it again, then reports it); a warning a library
prints as it loads goes to no cell; and the frozen objects are never collected, nor finalized at exit, and
:func:`gc.get_objects` does not list them (the garbage among them is collected first).

``python -m attention_dynamics.book.kernel --preload numpy,pandas,... -f CONNECTION_FILE
[ipykernel options]``, the libraries a subset of :data:`PRELOADED` (those the chapter
imports: :func:`attention_dynamics.book.execution.preloaded_for`); the runner starts it
through :class:`attention_dynamics.book.execution.ChapterKernelManager`.
Only the standard library is imported before ipykernel's own start, as in its launcher.
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
from pathlib import Path

__all__ = ["PRELOADED", "KERNEL_MODULE", "PRELOAD_FLAG", "main"]

KERNEL_MODULE = "attention_dynamics.book.kernel"
PRELOAD_FLAG = "--preload"

# numpy first, as in every chapter, and scipy.stats (through seaborn) after torch, as in every
# chapter that imports torch itself; where a chapter imports matplotlib and seaborn before the
# library brings in torch, torch loads after them there, which changes nothing a chapter
# sees: the only lasting warnings filters any of them adds are numpy's and scipy's.
PRELOADED = ("numpy", "pandas", "torch", "matplotlib", "scipy.stats")


def main() -> None:
    # the libraries to load, taken out of the arguments ipykernel reads and the kernel shows
    i = sys.argv.index(PRELOAD_FLAG) if PRELOAD_FLAG in sys.argv else None
    if any(a.startswith(PRELOAD_FLAG + "=") for a in sys.argv) or (i is not None and i + 1 >= len(sys.argv)):
        raise SystemExit(f"{PRELOAD_FLAG} takes the libraries as the next argument, comma-separated")
    names = sys.argv[i + 1].split(",") if i is not None else []
    if i is not None:
        del sys.argv[i:i + 2]
    unknown = sorted(set(names) - set(PRELOADED))
    if unknown:
        raise SystemExit(f"{PRELOAD_FLAG}: {', '.join(map(repr, unknown))} not among the libraries it loads "
                         f"({', '.join(PRELOADED)})")
    # as ipykernel_launcher, whose path the kernel's sys.argv shows: the working folder leaves
    # sys.path while the kernel loads and the shell puts it back (InteractiveShellApp.init_path)
    sys.argv[0] = importlib.util.find_spec("ipykernel_launcher").origin
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize()  # binds the ports jupyter_client chose before the slow part below
    gc.disable()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # left to the chapter's own import, which reports it in its cell
            pass
    gc.enable()
    gc.collect()
    gc.freeze()  # what is loaded now lives as long as the kernel: no collection need walk it again
    app.start()


if __name__ == "__main__":
    main()
