"""One look for every figure of the book, and the few plot types chapters share."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = ["use_style", "matrix_panels", "band"]


def use_style() -> None:
    """The book's look. Inside a Jupyter kernel it also selects the inline backend, so the
    figures land in the notebook even when MPLBACKEND (say, Agg) is set in the environment
    the kernel inherited."""
    _inline_in_kernel()
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 110, "figure.figsize": (7.0, 4.0),
                         "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9})


def matrix_panels(panels: dict[str, np.ndarray], *, hidden: np.ndarray | None = None, diverging=(),
                  xlabel: str = "key j", ylabel: str = "query i", annotate: bool = True, fmt: str = ".2f",
                  width: float = 3.3):
    """Heatmaps side by side; titles from the dict keys. Names in ``diverging`` get a
    colour map centred on zero. ``hidden`` (bool, True = masked) greys those cells out."""
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), width * 0.9), squeeze=False)
    for ax, (title, m) in zip(axes[0], panels.items()):
        m = np.asarray(m, dtype=float)
        kw = dict(cmap="viridis")
        if title in diverging:
            lim = np.nanmax(np.abs(np.where(hidden, np.nan, m) if hidden is not None else m)) or 1.0
            kw = dict(cmap="RdBu_r", vmin=-lim, vmax=lim, center=0.0)
        sns.heatmap(m, ax=ax, mask=hidden, annot=annotate, fmt=fmt, annot_kws={"size": 7}, cbar=True,
                    square=True, linewidths=0.5, linecolor="white", **kw)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_facecolor("#dddddd")
    fig.tight_layout()
    return fig


def band(ax, x, mean, spread, label=None, **kw):
    """A mean curve with a shaded band of +- spread."""
    x, mean, spread = map(np.asarray, (x, mean, spread))
    (line,) = ax.plot(x, mean, label=label, **kw)
    ax.fill_between(x, mean - spread, mean + spread, color=line.get_color(), alpha=0.2, linewidth=0)
    return line


def _inline_in_kernel() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None and getattr(ip, "kernel", None) is not None:
        ip.run_line_magic("matplotlib", "inline")
