"""One look for every figure of the book, and the few plot types chapters share."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = ["use_style", "matrix_panels", "band", "value_step_figure", "geometry_panels", "seed_interval"]


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


def value_step_figure(u, A, v, dV, eta: float):
    """R2 drawn in a 2-D value space (chapter *Responsibility-weighted values and first-order
    descent*). Left: each query's negative error signal -u_i, coloured by the value it
    attends to most. Right: each value v_j with the contributions -eta alpha_ij u_i of its
    users placed end to end (thin) and their sum, the step -eta dL/dv_j (thick).
    u: (T, 2), A: (T, S) attention, v: (S, 2) values, dV: (S, 2) = A^T u."""
    u, A, v, dV = (np.asarray(t, dtype=float) for t in (u, A, v, dV))
    colors = plt.cm.tab10(np.arange(A.shape[1]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.4))
    for i in range(len(u)):
        ax1.arrow(0, 0, -u[i, 0], -u[i, 1], color=colors[A[i].argmax()], width=0.045 / eta,
                  length_includes_head=True, alpha=0.8)
    lim = np.abs(u).max() * 1.2
    ax1.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", xlabel="value dim 1", ylabel="value dim 2",
            title="negative error signals −u_i (colour: most-attended value)")
    for j in range(A.shape[1]):
        start = v[j].copy()
        for i in np.argsort(-A[:, j]):
            step = -eta * A[i, j] * u[i]
            ax2.annotate("", xy=start + step, xytext=start,
                         arrowprops=dict(arrowstyle="-|>", color=colors[j], lw=0.6 + 3 * A[i, j], alpha=0.5))
            start = start + step
        ax2.annotate("", xy=v[j] - eta * dV[j], xytext=v[j], arrowprops=dict(arrowstyle="-|>", color="black", lw=2))
        ax2.scatter(*v[j], s=120, color=colors[j], edgecolor="black", zorder=3,
                    label=f"value {j + 1} (N_j = {A[:, j].sum():.2f})")
    ax2.set(aspect="equal", xlabel="value dim 1", ylabel="value dim 2", title="Δv_j = −η Σ_i α_ij u_i (thin: one user each)")
    ax2.legend(loc="best", fontsize=8)
    ax2.margins(0.25)
    fig.tight_layout()
    return fig


def geometry_panels(steps, measures: list[dict], V: int, L: int):
    """The wind-tunnel geometry along training, every layer (chapter *Geometry over
    training*): value-manifold variance shares, the entropy ordering |rho| of the leading
    value coordinate, the key frame's |cos| against random vectors and a simplex, attention
    entropy, the calibration error, and attention entropy by position at the end.
    ``measures``: one :func:`attention_dynamics.geometry.measure_model` result per checkpoint."""
    n_layers = len(measures[0]["layers"])

    def per_layer(key, reduce=lambda x: x):
        return np.array([[reduce(layer[key]) for layer in m["layers"]] for m in measures])

    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    series = {(0, 0): [(per_layer("pc_shares", lambda s: s[0]), "-", "PC1"),
                       (per_layer("pc_shares", lambda s: s[:3].sum()), "--", "PC1-3")],
              (0, 1): [(per_layer("rho_best"), "-", "best head"), (per_layer("rho_mean"), "--", "mean over heads")],
              (0, 2): [(per_layer("key_abs_cos"), "-", "")],
              (1, 0): [(per_layer("attention_bits", np.mean), "-", "")]}
    for (r, c), curves in series.items():
        for values, ls, what in curves:
            for l in range(n_layers):
                axes[r, c].plot(steps, values[:, l], color=f"C{l}", ls=ls,
                                label=f"layer {l + 1}" + (f": {what}" if what else ""))
    axes[0, 2].axhline(measures[0]["layers"][0]["key_abs_cos_random"], color="gray", ls=":", label="random vectors")
    axes[0, 2].axhline(1 / (V - 1), color="black", ls=":", label="regular simplex")
    axes[1, 1].plot(steps, [m["mae_bits"] for m in measures], color="C3")
    for l in range(n_layers):
        axes[1, 2].plot(np.arange(L + 1), measures[-1]["layers"][l]["attention_bits"], "o-", label=f"layer {l + 1}")
    axes[1, 2].set_xticks(np.arange(L + 1), [f"v{i + 1}" for i in range(L)] + ["q"])
    titles = {(0, 0): ("value manifold: variance share", "share"),
              (0, 1): ("|ρ|: leading value coordinate vs posterior entropy", "|Spearman ρ|"),
              (0, 2): ("key frame: mean |cos| between symbols", "|cos|"),
              (1, 0): ("attention entropy (mean over positions)", "bits"),
              (1, 1): ("calibration error", "mean |entropy error| (bits)")}
    for (r, c), (title, ylabel) in titles.items():
        axes[r, c].set(title=title, xlabel="step", ylabel=ylabel)
    axes[1, 1].set_yscale("log")
    axes[1, 2].set(title="attention focusing at the end, by position", xlabel="supervised position",
                   ylabel="attention entropy (bits)")
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def seed_interval(ax, seeds, values, bars: dict[str, float], *, ylabel: str, log: bool = False):
    """One number per seed (dots), the 95% t-interval of their mean (what a seed-spread
    verdict judges: :func:`attention_dynamics.rules.seed_ladder`) and the verdict's bars as
    lines labelled by ``bars`` (label -> value)."""
    from scipy.stats import t as student_t

    values = np.asarray(values, dtype=float)
    x = np.arange(len(values))
    ax.plot(x, values, "o", color="C0", label="one run per seed")
    if len(values) > 1:
        half = student_t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
        lo = max(values.mean() - half, values.min() / 10) if log else values.mean() - half  # a log axis ends at 0
        ax.errorbar([len(values)], [values.mean()], yerr=[[values.mean() - lo], [half]], fmt="s", color="C1",
                    capsize=4, label="mean, 95% interval")
    for i, (label, y) in enumerate(bars.items()):
        ax.axhline(y, color="gray", ls=["--", ":"][i % 2], lw=1, label=label)
    ax.set_xticks(list(x) + ([len(values)] if len(values) > 1 else []),
                  [f"seed {s}" for s in seeds] + (["mean"] if len(values) > 1 else []))
    ax.set(ylabel=ylabel, yscale="log" if log else "linear")
    ax.legend(fontsize=8)
    return ax


def _inline_in_kernel() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None and getattr(ip, "kernel", None) is not None:
        ip.run_line_magic("matplotlib", "inline")
