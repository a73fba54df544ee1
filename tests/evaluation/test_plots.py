"""What the figures draw (read back from the matplotlib objects, not from the PNG): history
panels per update with a y span that does not magnify noise, AMPS's metrics, reliability bins
with their counts, trace/rank figures with ArviZ's ESS and R-hat, the merged mixture posterior."""

import re

import matplotlib
import numpy as np
import pytest

from fedbayes_flwr.evaluation import plots
from fedbayes_flwr.evaluation.diagnostics import mcmc_summary, to_inference_data
from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference.posterior import GaussianPosterior, SamplePosterior, TracePosterior
from fedbayes_flwr.inference.vb.gmm import GMM, GMMParams

matplotlib.use("Agg")


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_history_is_drawn_per_update_and_noise_is_not_magnified():
    # a converged NLL wobbling by 1e-3 around 1.479 (the DHMC run of issue 25: 1.4785-1.4797)
    nll = [1.4785, 1.4797, 1.4789, 1.4792]
    history = [{"round": i + 1, "test_nll": v, "diagnostics": {"ess_min": 100.0 * (i + 1),
                                                               "rhat_max": 1.0 + 0.01 / (i + 1)}}
               for i, v in enumerate(nll)]
    fig = plots.history_figure(history)
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == ["test_nll", "ess_min", "rhat_max"]
    assert axes[-1].get_xlabel() == "update" and all("round" not in ax.get_xlabel() for ax in axes)
    np.testing.assert_array_equal(axes[0].lines[0].get_ydata(), nll)
    lo, hi = axes[0].get_ylim()
    # the floor: at least REL_Y_FLOOR of the value (2% of 1.4797 = 0.0296), so the 0.0012 wobble
    # fills at most 1/25 of the axis instead of all of it
    assert hi - lo >= plots.REL_Y_FLOOR * max(nll) and (max(nll) - min(nll)) / (hi - lo) < 0.05
    # a real trend is not squashed: ESS 100 -> 400 spans (nearly) the whole axis
    lo, hi = axes[1].get_ylim()
    assert (400 - 100) / (hi - lo) > 0.8
    _close(fig)


def test_amps_history_draws_heldout_loglik_and_objective_with_the_naive_merge():
    row = {"round": 1, "heldout_loglik": -1.287, "objective": 367.0, "naive_objective": 6.5,
           "merge_seconds": 0.1}
    fig = plots.history_figure([row])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "no metrics recorded" not in texts
    ll, obj = fig.axes
    assert ll.get_ylabel() == "heldout_loglik" and list(ll.lines[0].get_ydata()) == [-1.287]
    assert [list(line.get_ydata()) for line in obj.lines[:2]] == [[367.0], [6.5]]
    assert [t.get_text() for t in obj.get_legend().get_texts()] == ["objective", "naive merge"]
    assert "-1.287" in texts and "367" in texts and "6.5" in texts  # the values, as numbers
    _close(fig)


def test_reliability_bins_show_counts_and_small_bins_are_not_full_bars():
    diagram = {"bin_lower": [0.0, 0.25, 0.5, 0.75], "bin_upper": [0.25, 0.5, 0.75, 1.0],
               "accuracy": [None, 1.0, 0.6, 0.9], "confidence": [None, 0.4, 0.6, 0.9],
               "count": [0, 2, 10, 100]}
    fig = plots.reliability_figure(diagram)
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 3  # the empty bin is not drawn
    assert [round(b.get_x(), 2) for b in bars] == [0.25, 0.5, 0.75]
    assert [b.get_height() for b in bars] == [1.0, 0.6, 0.9]
    few, full = bars[0], bars[1:]
    assert not few.get_fill() and few.get_hatch() == "//"  # 2 points: an outline, not a bar
    assert all(b.get_fill() and not b.get_hatch() for b in full)
    assert [t.get_text() for t in ax.texts] == ["2", "10", "100"]
    _close(fig)


def _ar1_chains(rng, chains, draws, rho):
    """Stationary AR(1) chains with unit marginal variance."""
    x = np.empty((chains, draws))
    x[:, 0] = rng.standard_normal(chains)
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho ** 2) * rng.standard_normal(chains)
    return x


def test_trace_figure_shows_the_worst_mixing_coordinates_with_arviz_ess_and_rhat():
    rng = np.random.default_rng(3)
    chains = rng.standard_normal((2, 400, 6))
    chains[:, :, 4] = _ar1_chains(rng, 2, 400, rho=0.9)  # the slow coordinate
    posterior = TracePosterior(chains, extras={}, counts={})
    fig = plots.trace_figure(posterior, coordinates=3)
    summary = mcmc_summary(posterior)
    # AR(1) with rho = 0.9: ESS = N (1 - rho) / (1 + rho) = 800 / 19 = 42 against ~800 for the
    # i.i.d. coordinates (a 19x gap; the check below leaves a 6x margin for estimator noise)
    assert summary["ess_bulk"][4] < summary["ess_bulk"][np.arange(6) != 4].min() / 3
    first = fig.axes[0]
    assert first.get_title(loc="left").startswith("theta[4]:")
    np.testing.assert_array_equal(first.lines[0].get_ydata(), chains[0, :, 4])
    np.testing.assert_array_equal(first.lines[1].get_ydata(), chains[1, :, 4])
    shown = re.findall(r"bulk ESS (\d+), tail ESS (\d+), R-hat ([\d.]+)",
                       first.get_title(loc="left"))[0]
    assert float(shown[0]) == pytest.approx(summary["ess_bulk"][4], abs=0.5)
    assert float(shown[2]) == pytest.approx(summary["r_hat"][4], abs=5e-4)
    assert len(fig.axes) == 6 and fig.axes[1].patches  # three rows: trace + rank histogram
    assert "min bulk ESS" in fig._suptitle.get_text()
    _close(fig)


def test_disagreeing_chains_show_a_large_rhat():
    rng = np.random.default_rng(5)
    chains = rng.standard_normal((2, 300, 1))
    chains[1] += 3.0  # two chains in different places: R-hat far above 1 (about 2.3 here)
    fig = plots.trace_figure(SamplePosterior(chains))
    rhat = float(re.findall(r"R-hat ([\d.]+)", fig.axes[0].get_title(loc="left"))[0])
    assert rhat > 1.5
    _close(fig)


def test_inference_data_export_keeps_chains_draws_and_coordinates():
    chains = np.random.default_rng(0).standard_normal((3, 50, 2))
    idata = to_inference_data(SamplePosterior(chains))
    theta = idata.posterior["theta"]
    assert theta.dims == ("chain", "draw", "theta_dim") and theta.shape == (3, 50, 2)
    np.testing.assert_array_equal(theta.values, chains)
    gaussian = GaussianPosterior.__new__(GaussianPosterior)  # no draws: a clear error
    with pytest.raises(ValueError, match="no draws"):
        to_inference_data(gaussian)


def test_mixture_posterior_draws_the_predictive_density_and_the_merged_components():
    vb = GMM(num_components=2, dim=1, noise_var=0.09)
    means = np.array([[-1.0], [2.0]])
    prec = np.array([[400.0], [100.0]])
    params = GMMParams(expfam.Gaussian(means * prec, prec), expfam.Weights(np.array([30.0, 10.0])))

    class Posterior:  # the StructuredPosterior fields the figure reads
        kind = "structured"

    post = Posterior()
    post.params, post.vb = params, vb
    x = np.random.default_rng(1).normal(size=(200, 1))
    fig = plots.mixture_posterior_figure(post, x)
    ax = fig.axes[0]
    grid, density = ax.lines[0].get_xdata(), ax.lines[0].get_ydata()
    # a density: it integrates to 1 over a grid that covers both components (trapezoid error
    # at 800 points over ~10 units is far below 1e-3; the tails beyond the grid are < 1e-6)
    assert np.trapezoid(density, grid) == pytest.approx(1.0, abs=1e-3)
    markers = [c for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)]
    np.testing.assert_allclose(markers[0].get_offsets()[:, 0], [-1.0, 2.0])
    sizes = markers[0].get_sizes()
    assert sizes[0] > sizes[1]  # E[weight] 0.75 vs 0.25
    assert plots.mixture_posterior_figure(post, np.zeros((5, 2))) is None  # not 1-D: no figure
    _close(fig)


def test_progress_line_shows_a_samplers_ess_and_rhat_and_amps_metrics():
    from fedbayes_flwr.runtime.recorder import progress_text

    sampler = {"round": 300, "test_nll": 1.4783, "rejected_replies": 0,
               "diagnostics": {"ess_min": 453.6, "rhat_max": 1.0238, "ess_mean": 700.0}}
    assert progress_text(sampler) == "test_nll=1.478 rejected_replies=0 ess_min=453.6 rhat_max=1.024"
    one_chain = {"round": 1, "diagnostics": {"ess_min": 20.0, "rhat_max": float("nan")}}
    assert progress_text(one_chain) == "ess_min=20"  # no R-hat from one chain
    amps = {"round": 1, "heldout_loglik": -1.287, "objective": 367.0, "rejected_replies": 0}
    assert progress_text(amps) == "heldout_loglik=-1.287 objective=367 rejected_replies=0"
