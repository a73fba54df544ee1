"""Matplotlib figures for training histories, reliability diagrams and benchmark curves.

The non-interactive ``Agg`` backend is selected on first use, so importing this module or calling
its functions never opens a window. Every function writes a PNG and closes its figure.
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["HISTORY_METRICS", "plot_curves", "plot_history", "plot_reliability"]

HISTORY_METRICS: tuple[str, ...] = (
    "test_accuracy",
    "test_nll",
    "test_ece",
    "test_rmse",
    "log_marginal_likelihood",
)


def _pyplot() -> Any:
    """Return ``matplotlib.pyplot`` with the ``Agg`` backend selected."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _is_number(value: Any) -> bool:
    """True for a finite real number (``None`` and NaN are skipped)."""
    if value is None or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _save(fig: Any, path: str | os.PathLike) -> None:
    """Save ``fig`` as a PNG at ``path`` and close it."""
    plt = _pyplot()
    try:
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png", dpi=100)
    finally:
        plt.close(fig)


def plot_history(history: list[dict], path: str | os.PathLike, title: str = "") -> None:
    """Plot metrics against the federated round, one subplot per metric.

    Parameters
    ----------
    history : list of dict
        Per-round records, each with ``"round"`` and any of :data:`HISTORY_METRICS`. Missing,
        ``None`` or non-finite values are skipped; metrics with no values get no subplot.
    path : str or os.PathLike
        Output PNG path.
    title : str, optional
        Figure title.
    """
    plt = _pyplot()
    series = []
    for key in HISTORY_METRICS:
        pts = [
            (float(rec["round"]), float(rec[key]))
            for rec in history
            if _is_number(rec.get("round")) and _is_number(rec.get(key))
        ]
        if pts:
            series.append((key, pts))
    n = max(len(series), 1)
    fig, axes = plt.subplots(n, 1, figsize=(6, 2.4 * n + 0.6), sharex=True, squeeze=False)
    if not series:
        axes[0, 0].text(0.5, 0.5, "no metrics recorded", ha="center", va="center")
    for ax, (key, pts) in zip(axes[:, 0], series, strict=False):
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, ys, marker="o")
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("round")
    if title:
        fig.suptitle(title)
    _save(fig, path)


def plot_reliability(diagram: dict[str, list], path: str | os.PathLike, title: str = "") -> None:
    """Reliability diagram: accuracy per confidence bin against the diagonal, with bin counts.

    Parameters
    ----------
    diagram : dict of str to list
        Output of :func:`fedbayes_flwr.evaluation.predictive.reliability_diagram`.
    path : str or os.PathLike
        Output PNG path.
    title : str, optional
        Axes title.
    """
    plt = _pyplot()
    lower = [float(v) for v in diagram["bin_lower"]]
    upper = [float(v) for v in diagram["bin_upper"]]
    acc = [float(v) if _is_number(v) else 0.0 for v in diagram["accuracy"]]
    counts = [int(c) for c in diagram["count"]]
    widths = [u - lo for lo, u in zip(lower, upper, strict=True)]
    fig, (ax, ax_count) = plt.subplots(
        2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax.bar(lower, acc, width=widths, align="edge", edgecolor="black", alpha=0.7, label="accuracy")
    lo, hi = (lower[0], upper[-1]) if lower else (0.0, 1.0)
    ax.plot([lo, hi], [lo, hi], "k--", label="perfect calibration")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left")
    if title:
        ax.set_title(title)
    ax_count.bar(lower, counts, width=widths, align="edge", edgecolor="black", color="gray")
    ax_count.set_xlabel("confidence")
    ax_count.set_ylabel("count")
    _save(fig, path)


def plot_curves(
    curves: dict[str, list[tuple[float, float]]],
    path: str | os.PathLike,
    xlabel: str,
    ylabel: str,
    title: str = "",
    hline: tuple[str, float] | None = None,
    logy: bool = False,
) -> None:
    """Several named ``(x, y)`` curves on one axis, with an optional reference line.

    Parameters
    ----------
    curves : dict of str to list of (float, float)
        Curve label to its points; points with a non-finite or ``None`` value are skipped.
    path : str or os.PathLike
        Output PNG path.
    xlabel, ylabel : str
        Axis labels.
    title : str, optional
        Axes title.
    hline : (str, float), optional
        Label and height of a horizontal reference line (e.g. an exact/centralised baseline).
    logy : bool, optional
        Logarithmic y axis.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pts in curves.items():
        pts = [(float(x), float(y)) for x, y in pts if _is_number(x) and _is_number(y)]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if hline is not None:
        ax.axhline(float(hline[1]), color="black", linestyle="--", label=hline[0])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    _save(fig, path)
