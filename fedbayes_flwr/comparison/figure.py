"""``compare.png``: each algorithm's marginals against the reference, and the metric bars."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fedbayes_flwr.comparison.reference import ReferencePosterior
from fedbayes_flwr.comparison.table import sort_rows
from fedbayes_flwr.evaluation.plots import _pyplot, _save

__all__ = ["MARGINALS", "comparison_figure", "save_comparison_figure"]

MARGINALS = 4
"""Parameters whose marginals are drawn (the first ones)."""
DRAWS_SEED = np.array([2718, 28], dtype=np.int32)


def _bars(ax, rows: list[dict], key: str, title: str, log: bool = False) -> None:
    rows = [r for r in rows if r.get(key) is not None]
    if not rows:
        ax.set_axis_off()
        return
    names = [r["algorithm"] for r in rows]
    ax.barh(names, [r[key] for r in rows], color="tab:blue")
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    if log and all(r[key] > 0 for r in rows):
        ax.set_xscale("log")
    ax.tick_params(labelsize=8)


def comparison_figure(reference: ReferencePosterior, rows: list[dict],
                      posteriors: dict[str, Any]) -> Any:
    """The figure: up to :data:`MARGINALS` marginals (reference filled, algorithms as lines),
    then bars of the posterior error (W1 or mean error, in reference sd) and a test metric."""
    rows = sort_rows(rows)
    marginals = 0
    if reference.draws is not None:
        marginals = min(MARGINALS, reference.draws.shape[1])
    cols = max(marginals, 2)
    fig, axes = _pyplot().subplots(2, cols, figsize=(3.2 * cols, 6.0), squeeze=False)
    for j in range(cols):
        ax = axes[0][j]
        if j >= marginals:
            ax.set_axis_off()
            continue
        assert reference.draws is not None
        ref = reference.draws[:, j]
        lo, hi = np.quantile(ref, [0.001, 0.999])
        pad = 0.5 * (hi - lo)
        bins = np.linspace(lo - pad, hi + pad, 50)
        heights, _, _ = ax.hist(ref, bins=bins, density=True, color="0.8",
                                label=f"reference ({reference.kind})")
        for name, post in posteriors.items():
            if int(post.dim) != reference.draws.shape[1]:
                continue
            draws = np.asarray(post.sample(DRAWS_SEED, reference.draws.shape[0]))[:, j]
            ax.hist(np.clip(draws, bins[0], bins[-1]), bins=bins, density=True,
                    histtype="step", label=name)
        ax.set_ylim(0, 2.5 * float(np.max(heights)))  # a point estimate's spike is cut
        ax.set_title(f"theta[{j}]", fontsize=9)
        ax.tick_params(labelsize=8)
        if j == 0:
            ax.legend(fontsize=7)
    error_key = "w1" if any(r.get("w1") is not None for r in rows) else "mean_error"
    _bars(axes[1][0], rows, error_key,
          "marginal W1 / reference sd (max)" if error_key == "w1" else "mean error / ref sd",
          log=True)
    metric = next((k for k in ("test_accuracy", "test_rmse", "test_nll")
                   if any(r.get(k) is not None for r in rows)), None)
    if metric:
        _bars(axes[1][1], rows, metric, metric.replace("_", " "))
    else:
        axes[1][1].set_axis_off()
    for j in range(2, cols):
        axes[1][j].set_axis_off()
    return fig


def save_comparison_figure(path: str | os.PathLike, reference: ReferencePosterior,
                           rows: list[dict], posteriors: dict[str, Any]) -> None:
    """Write :func:`comparison_figure` as a PNG at ``path``."""
    _save(comparison_figure(reference, rows, posteriors), path)  # the run plots' PNG writer
