"""Matplotlib figures for training histories, reliability diagrams, MCMC diagnostics, a merged
mixture posterior and benchmark curves.

The non-interactive ``Agg`` backend is selected on first use, so importing this module or calling
its functions never opens a window. Each ``*_figure`` function returns the figure (tests read what
it draws); each ``plot_*`` function draws the same figure, writes a PNG and closes it.

Conventions: the x axis of a run's history is the server ``update`` (the console's word); a
metric's y axis spans at least :data:`REL_Y_FLOOR` of the metric's size (and at least
:data:`ABS_Y_FLOOR`), so float noise in a converged metric is drawn flat instead of as a trend.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from fedbayes_flwr.evaluation.diagnostics import import_arviz, mcmc_summary, to_inference_data
from fedbayes_flwr.inference import expfam

__all__ = ["ABS_Y_FLOOR", "DIAGNOSTIC_METRICS", "HISTORY_METRICS", "MIN_BIN_COUNT", "REL_Y_FLOOR",
           "history_figure", "mixture_posterior_figure", "plot_curves", "plot_history",
           "plot_mixture_posterior", "plot_reliability", "plot_trace", "reliability_figure",
           "trace_figure"]

HISTORY_METRICS: tuple[str, ...] = (
    "test_accuracy",
    "test_nll",
    "test_ece",
    "test_rmse",
    "log_marginal_likelihood",
    "kl",
    "heldout_loglik",
    "objective",
)
"""Top-level keys of a history row drawn by :func:`history_figure`, one panel each."""

DIAGNOSTIC_METRICS: tuple[str, ...] = ("ess_min", "rhat_max")
"""Keys of a row's ``diagnostics`` drawn too (a sampler's ESS and R-hat per update)."""

COMPANIONS: dict[str, tuple[str, str]] = {"objective": ("naive_objective", "naive merge")}
"""A panel's second series (key, label): AMPS's objective next to the unaligned merge's."""

REL_Y_FLOOR = 0.02
"""Smallest y span of a history panel, relative to the largest ``|value|`` drawn."""
ABS_Y_FLOOR = 1e-3
"""Smallest y span of a history panel, absolute (metrics near zero)."""
MIN_BIN_COUNT = 5
"""Reliability bins with fewer test points are drawn hatched and pale (their accuracy is noise)."""
TRACE_COORDINATES = 4
"""Coordinates drawn by :func:`trace_figure` (those with the lowest bulk ESS)."""


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


def _floor_ylim(ax: Any, ys: list[float]) -> None:
    """Widen the y range to at least ``max(REL_Y_FLOOR * max|y|, ABS_Y_FLOOR)`` around the data."""
    lo, hi = min(ys), max(ys)
    floor = max(REL_Y_FLOOR * max(abs(lo), abs(hi)), ABS_Y_FLOOR)
    if hi - lo < floor:
        centre = 0.5 * (lo + hi)
        ax.set_ylim(centre - 0.55 * floor, centre + 0.55 * floor)


def _history_series(history: list[dict]) -> list[tuple[str, list, list]]:
    """``(key, main points, companion points)`` for every metric with a finite value."""
    def points(key: str, nested: bool) -> list[tuple[float, float]]:
        out = []
        for rec in history:
            value = (rec.get("diagnostics") or {}).get(key) if nested else rec.get(key)
            if _is_number(rec.get("round")) and _is_number(value):
                out.append((float(rec["round"]), float(value)))
        return sorted(out)

    series = []
    for key, nested in [*((k, False) for k in HISTORY_METRICS),
                        *((k, True) for k in DIAGNOSTIC_METRICS)]:
        pts = points(key, nested)
        if pts:
            extra = points(COMPANIONS[key][0], False) if key in COMPANIONS else []
            series.append((key, pts, extra))
    return series


def history_figure(history: list[dict], title: str = "") -> Any:
    """Metrics against the server update, one panel per metric; returns the figure.

    Parameters
    ----------
    history : list of dict
        Per-update records, each with ``"round"`` (the update) and any of
        :data:`HISTORY_METRICS`, and optionally ``"diagnostics"`` with any of
        :data:`DIAGNOSTIC_METRICS`. Missing, ``None`` or non-finite values are skipped; metrics
        with no values get no panel.
    title : str, optional
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
        Each panel's first line is the metric; the last value is written next to its point (a
        one-update run, AMPS's one-shot merge, still reads as numbers); AMPS's ``objective`` panel
        also draws ``naive_objective``. The y span is floored (module docstring).

    References
    ----------
    Vehtari et al. (2021), "Rank-normalization, folding, and localization: an improved R-hat",
    Bayesian Analysis 16(2), Section 4 (the R-hat < 1.01 line drawn on the ``rhat_max`` panel).
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    series = _history_series(history)
    n = max(len(series), 1)
    fig, axes = plt.subplots(n, 1, figsize=(6, 2.2 * n + 0.8), sharex=True, squeeze=False)
    if not series:
        axes[0, 0].text(0.5, 0.5, "no metrics recorded", ha="center", va="center")
    for ax, (key, pts, extra) in zip(axes[:, 0], series, strict=False):
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, marker="o", label=key)
        drawn = list(ys)
        if extra:
            ex, ey = zip(*extra, strict=True)
            ax.plot(ex, ey, marker="s", linestyle="--", label=COMPANIONS[key][1])
            ax.annotate(f"{ey[-1]:.4g}", (ex[-1], ey[-1]), textcoords="offset points",
                        xytext=(6, 4), fontsize="small")
            drawn += list(ey)
            ax.legend(loc="best", fontsize="small")
        ax.annotate(f"{ys[-1]:.4g}", (xs[-1], ys[-1]), textcoords="offset points",
                    xytext=(6, 4), fontsize="small")
        if key == "rhat_max":
            ax.axhline(1.01, color="gray", linestyle=":", linewidth=1)  # Vehtari et al. (2021)
            drawn.append(1.01)
        _floor_ylim(ax, drawn)
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
    updates = {x for _, pts, _ in series for x, _ in pts}
    if len(updates) == 1:  # one update (AMPS's one-shot merge): centre it (the x axis is shared)
        only = updates.pop()
        axes[-1, 0].set_xlim(only - 1, only + 1)
    axes[-1, 0].set_xlabel("update")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    return fig


def plot_history(history: list[dict], path: str | os.PathLike, title: str = "") -> None:
    """Write :func:`history_figure` as a PNG at ``path``."""
    _save(history_figure(history, title), path)


def reliability_figure(diagram: dict[str, list], title: str = "") -> Any:
    """Reliability diagram: accuracy per confidence bin against the diagonal; returns the figure.

    Every non-empty bin is labelled with its number of test points. Bins holding fewer than
    :data:`MIN_BIN_COUNT` points are drawn as pale hatched outlines (an accuracy from 1-4 points
    says little); empty bins are not drawn. The lower panel shows the counts.

    Parameters
    ----------
    diagram : dict of str to list
        Output of :func:`fedbayes_flwr.evaluation.predictive.reliability_diagram`.
    title : str, optional
        Axes title.

    Returns
    -------
    matplotlib.figure.Figure
        The upper axes' bar patches are the non-empty bins, in bin order; its texts are their
        counts.

    References
    ----------
    DeGroot & Fienberg (1983), "The comparison and evaluation of forecasters" (reliability
    diagrams); Guo et al. (2017), "On calibration of modern neural networks", Section 2.
    """
    plt = _pyplot()
    lower = [float(v) for v in diagram["bin_lower"]]
    upper = [float(v) for v in diagram["bin_upper"]]
    acc = [float(v) if _is_number(v) else 0.0 for v in diagram["accuracy"]]
    counts = [int(c) for c in diagram["count"]]
    fig, (ax, ax_count) = plt.subplots(
        2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    few_label = f"fewer than {MIN_BIN_COUNT} points"
    for lo, up, a, c in zip(lower, upper, acc, counts, strict=True):
        if c == 0:
            continue
        if c >= MIN_BIN_COUNT:
            ax.bar(lo, a, width=up - lo, align="edge", edgecolor="black", color="C0", alpha=0.7,
                   label="accuracy")
        else:
            ax.bar(lo, a, width=up - lo, align="edge", edgecolor="gray", fill=False, hatch="//",
                   alpha=0.5, label=few_label)
        ax.text(lo + 0.5 * (up - lo), 0.5 * a if a > 0.12 else a + 0.02, str(c), ha="center",
                va="center" if a > 0.12 else "bottom", fontsize="x-small",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8,
                      "linewidth": 0})
    lo, hi = (lower[0], upper[-1]) if lower else (0.0, 1.0)
    ax.plot([lo, hi], [lo, hi], "k--", label="perfect calibration")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("accuracy (number of test points on each bar)")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="lower left", bbox_to_anchor=(0.0, 1.0),
              ncol=3, fontsize="x-small", frameon=False)  # above the axes: no bar hidden
    if title:
        fig.suptitle(title)
    widths = [u - lo for lo, u in zip(lower, upper, strict=True)]
    ax_count.bar(lower, counts, width=widths, align="edge", edgecolor="black", color="gray")
    ax_count.set_xlabel("confidence")
    ax_count.set_ylabel("count")
    return fig


def plot_reliability(diagram: dict[str, list], path: str | os.PathLike, title: str = "") -> None:
    """Write :func:`reliability_figure` as a PNG at ``path``."""
    _save(reliability_figure(diagram, title), path)


def trace_figure(posterior: Any, title: str = "",
                 coordinates: int = TRACE_COORDINATES) -> Any:
    """Trace and rank plots of a sampler's chains, with ESS and R-hat; returns the figure.

    One row per coordinate, at most ``coordinates`` of them: those with the lowest bulk ESS
    (the worst-mixing ones). Left: every chain's draws against the draw index. Right: ArviZ's
    rank plot (``arviz.plot_rank``: the histogram of each chain's ranks among all draws, flat
    when the chains agree). Each row's title gives bulk ESS, tail ESS and R-hat
    (:func:`fedbayes_flwr.evaluation.diagnostics.mcmc_summary`); the figure's title the minimum
    ESS and maximum R-hat over all coordinates.

    Parameters
    ----------
    posterior : SamplePosterior
        A posterior with draws (``chains`` of shape ``(C, N, d)``), e.g. PDMC's or decentralized
        HMC's.
    title : str, optional
        Prefix of the figure title.
    coordinates : int, optional
        Rows drawn.

    Returns
    -------
    matplotlib.figure.Figure
        Axes ``[2 i]`` hold row ``i``'s trace (one line per chain), ``[2 i + 1]`` its rank plot.

    References
    ----------
    Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-normalization, folding, and
    localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2),
    Sections 4-5 (rank plots, bulk and tail ESS, R-hat).
    """
    plt = _pyplot()
    az = import_arviz()
    chains = np.asarray(posterior.chains, dtype=np.float64)
    summary = mcmc_summary(posterior)
    order = np.argsort(summary["ess_bulk"], kind="stable")[:max(1, int(coordinates))]
    idata = to_inference_data(posterior)
    fig, axes = plt.subplots(len(order), 2, figsize=(9, 2.3 * len(order) + 0.9), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for row, j in enumerate(order):
        ax_trace, ax_rank = axes[row]
        for c in range(chains.shape[0]):
            ax_trace.plot(np.arange(chains.shape[1]), chains[c, :, j], linewidth=0.6,
                          alpha=0.8, label=f"chain {c}")
        ax_trace.set_ylabel(f"theta[{j}]")
        ax_trace.set_title(f"theta[{j}]: bulk ESS {summary['ess_bulk'][j]:.0f}, tail ESS "
                           f"{summary['ess_tail'][j]:.0f}, R-hat {summary['r_hat'][j]:.3f}",
                           fontsize="small", loc="left")
        az.plot_rank(idata, var_names=["theta"], coords={"theta_dim": [int(j)]}, ax=ax_rank)
        ax_rank.set_title("rank plot (flat: chains agree)", fontsize="small")
        ax_rank.set_xlabel("rank (all chains)", fontsize="small")
        ax_rank.set_ylabel("chain", fontsize="small")
        ax_rank.tick_params(labelsize="x-small")
    axes[-1, 0].set_xlabel("draw (kept, per chain)")
    fig.suptitle(f"{title + ': ' if title else ''}{chains.shape[0]} chains x {chains.shape[1]} "
                 f"draws; min bulk ESS {np.min(summary['ess_bulk']):.0f}, max R-hat "
                 f"{np.max(summary['r_hat']):.3f} over {chains.shape[2]} coordinates",
                 fontsize="medium")
    return fig


def plot_trace(posterior: Any, path: str | os.PathLike, title: str = "") -> None:
    """Write :func:`trace_figure` as a PNG at ``path``."""
    _save(trace_figure(posterior, title), path)


def mixture_posterior_figure(posterior: Any, x: np.ndarray, title: str = "") -> Any | None:
    """A merged one-dimensional mixture posterior over the held-out data; returns the figure,
    or ``None`` where the posterior is not a 1-D mixture with a predictive density.

    Draws the held-out points' histogram (as a density), the posterior predictive density
    ``sum_k E[pi_k] N(x | m_k, sigma^2 + v_k)`` (the model's ``log_predictive``) on a grid, and
    each component's posterior mean with a two-standard-deviation bar, its marker size
    proportional to the expected weight.

    Parameters
    ----------
    posterior : StructuredPosterior
        AMPS's merged posterior (``params`` with ``means`` and ``weights`` blocks, ``vb`` with
        ``log_predictive``).
    x : numpy.ndarray
        Held-out points, ``(n, 1)`` or ``(n,)``.
    title : str, optional
        Axes title.

    Returns
    -------
    matplotlib.figure.Figure or None
        ``ax.lines[0]`` is the predictive density on its grid; the component markers are the
        axes' ``PathCollection`` (offsets: the means, at height 0).

    References
    ----------
    Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.1 (the
    mixture example; the merged posterior's components).
    """
    params, vb = getattr(posterior, "params", None), getattr(posterior, "vb", None)
    x = np.asarray(x, dtype=np.float64)
    if (params is None or not hasattr(vb, "log_predictive") or x.ndim > 2
            or (x.ndim == 2 and x.shape[1] != 1) or len(x) == 0
            or not hasattr(params, "means") or not hasattr(params, "weights")):
        return None
    means = np.ravel(expfam.mean(params.means))
    sds = np.ravel(expfam.std(params.means))
    weights = np.ravel(expfam.mean(params.weights))
    if means.shape != weights.shape:
        return None
    plt = _pyplot()
    data = x.reshape(-1)
    spread = max(float(np.std(data)), 1e-3)
    lo = min(data.min(), (means - 2 * sds).min()) - spread
    hi = max(data.max(), (means + 2 * sds).max()) + spread
    grid = np.linspace(lo, hi, 800)
    density = np.exp(vb.log_predictive(params, grid[:, None]))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(grid, density, color="C0", label="posterior predictive density")
    ax.errorbar(means, np.zeros_like(means), xerr=2 * sds, fmt="none", ecolor="C3", capsize=3)
    ax.scatter(means, np.zeros_like(means), s=400 * weights + 10, color="C3", zorder=3,
               label="component means (size: E[weight]; bars: 2 sd)")
    ax.hist(data, bins=min(40, max(8, len(data) // 10)), density=True, color="gray",
            alpha=0.35, label=f"held-out points ({len(data)})")
    ax.set_xlabel("x")
    ax.set_ylabel("density")
    ax.legend(loc="upper left", fontsize="x-small")
    if title:
        ax.set_title(title)
    return fig


def plot_mixture_posterior(posterior: Any, x: np.ndarray, path: str | os.PathLike,
                           title: str = "") -> bool:
    """Write :func:`mixture_posterior_figure` as a PNG at ``path``; ``False`` (nothing written)
    where the posterior is not a 1-D mixture."""
    fig = mixture_posterior_figure(posterior, x, title)
    if fig is None:
        return False
    _save(fig, path)
    return True


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
