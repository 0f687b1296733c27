"""The kernel the runner executes chapters in: ipykernel as ``python -m ipykernel_launcher``
starts it, with the libraries every chapter imports loaded first, the garbage collector off
while they load, and their objects then frozen out of its passes (:func:`gc.freeze`).

Why: a chapter's kernel spent about 4.6 s before and after its own work at the quick profile,
of which some 0.5 s were collections during the imports, 0.3-1.0 s full collections during the
chapter that walked the imported libraries' 300,000 objects again, and 0.6 s the collections
of the interpreter's exit (``benchmarks/kernel_start.py`` measures each). The libraries are
the same ones the chapter imports itself, in the same environment, so a chapter computes
exactly what it computes in a plain kernel; only modules that read nothing the kernel sets
up later are loaded (not ``matplotlib.pyplot``, whose backend the kernel chooses).

``python -m attention_dynamics.book.kernel -f CONNECTION_FILE [ipykernel options]``; the
runner starts it through :class:`ChapterKernelManager`.
"""
from __future__ import annotations

import gc
import importlib
import os
import sys
from pathlib import Path

from jupyter_client import AsyncKernelManager

__all__ = ["PRELOADED", "ChapterKernelManager", "main"]

# In the order the chapters import them (numpy's libraries before torch's, as in every
# chapter); a missing one is left to the chapter, which then fails as it would anyway.
PRELOADED = ("numpy", "scipy.stats", "pandas", "torch", "matplotlib")
LAUNCHER = "ipykernel_launcher"
# What ipykernel itself sets before the chapter imports matplotlib (IPKernelApp.init_gui_pylab):
# matplotlib reads it as it is imported, which here is before the kernel app runs.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def main(argv: list[str] | None = None) -> None:
    # as ipykernel_launcher: the working folder leaves sys.path while the kernel loads and
    # the shell puts it back (InteractiveShellApp.init_path)
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = INLINE_BACKEND
    gc.disable()
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    from ipykernel import kernelapp

    gc.enable()
    gc.freeze()  # what is loaded now lives as long as the kernel: no collection need walk it again
    kernelapp.launch_new_instance(argv)


class ChapterKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, starting :func:`main` where the kernel's command is
    ipykernel's own launcher in this interpreter (any other kernel command is left as it is)."""

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        # only in the runner's own interpreter, the one that imports this library
        if cmd[:3] == [sys.executable, "-m", LAUNCHER]:
            cmd[cmd.index(LAUNCHER)] = __name__
        return cmd


if __name__ == "__main__":
    main()
