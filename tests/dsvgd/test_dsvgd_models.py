"""Models and data for DSVGD (Kassab & Simeone 2022): the ``mixture-1d`` toy (uniform prior,
Gaussian-mixture likelihood rows, KL to the exact posterior by quadrature), ``logistic-hyperprior``
(Gamma hyperprior on the weights' precision), :meth:`Model.log_prior_and_grad` for every model,
and the ``twonorm`` and ``mixture-1d`` datasets."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf
from scipy import integrate
from scipy.stats import gamma, gaussian_kde, multivariate_normal, norm, truncnorm

from fedbayes_flwr.data import DataError, load_dataset, partition_indices
from fedbayes_flwr.data.embedded import MIXTURE_1D_ROWS
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import GaussianPosterior, SamplePosterior
from fedbayes_flwr.models import MODELS, make_model
from fedbayes_flwr.models.mixture import (
    mixture_1d_grid,
    mixture_1d_kl,
    mixture_1d_log_likelihood,
    mixture_1d_optimal_density,
)

NUM_FEATURES = 3
H = 1e-6  # central-difference step


def _fd_grad(fn, theta: np.ndarray) -> np.ndarray:
    """Central differences of a batched ``fn: (S, P) -> (S,)`` at each row of ``theta``."""
    s, p = theta.shape
    steps = H * np.eye(p)
    batch = np.concatenate([theta[:, None, :] + steps, theta[:, None, :] - steps], axis=1)
    f = np.asarray(fn(batch.reshape(-1, p))).reshape(s, 2 * p)
    return (f[:, :p] - f[:, p:]) / (2 * H)


def _q_opt_reference(points: np.ndarray) -> np.ndarray:
    """q_opt of the paper's toy from scipy densities, normalised by adaptive quadrature (quad)."""
    def unnormalised(t):
        return norm(1.0, 2.0).pdf(t) * (norm(-3.0, 1.0).pdf(t) + norm(3.0, np.sqrt(2.0)).pdf(t))

    z, _ = integrate.quad(unnormalised, -6.0, 6.0, points=[-3.0, 1.0, 3.0], epsabs=0, epsrel=1e-12)
    return unnormalised(points) / z


def _samples_from_q_opt(n: int, seed: int) -> np.ndarray:
    """``n`` draws from q_opt by inverse-CDF sampling on the quadrature grid (trapezoid CDF)."""
    grid = mixture_1d_grid()
    q = mixture_1d_optimal_density(MIXTURE_1D_ROWS, grid)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (q[1:] + q[:-1]) * np.diff(grid))])
    return np.interp(np.random.default_rng(seed).random(n), cdf / cdf[-1], grid)


# ------------------------------------------------------------------ generic: every model's prior


@pytest.mark.parametrize("name", MODELS)
def test_declared_prior_attributes(name):
    model = make_model(name)
    assert isinstance(model.gaussian_prior, bool)
    if model.support is not None:
        low, high = model.support
        assert isinstance(low, float) and isinstance(high, float) and low < high


@pytest.mark.parametrize("name", MODELS)
def test_log_prior_and_grad_is_log_prior_tf_and_its_gradient(name):
    model = make_model(name, 1.0, (4,), 3)
    p = model.param_dim(NUM_FEATURES)
    prior = G.from_moments(np.full(p, 0.3), np.full(p, 1.7))
    theta = 0.5 * np.random.default_rng(0).normal(size=(4, p))  # inside any support used here
    values, grads = model.log_prior_and_grad(theta, prior)
    assert values.shape == (4,) and grads.shape == (4, p)
    # compiled vs eager evaluation of the same expression: rounding only
    np.testing.assert_allclose(values, model.log_prior_tf(tf.constant(theta), prior).numpy(),
                               rtol=1e-12)
    fd = _fd_grad(lambda t: model.log_prior_and_grad(t, prior)[0], theta)
    # rounding error of a central difference ~ eps |f| / h ~ 1e-8 here; truncation ~ h^2 f''' ~ 0
    atol = 10 * np.finfo(np.float64).eps * np.max(np.abs(values)) / H
    np.testing.assert_allclose(grads, fd, rtol=1e-5, atol=atol)
    one_value, one_grad = model.log_prior_and_grad(theta[0], prior)  # a (P,) vector: unbatched
    assert np.shape(one_value) == () and one_grad.shape == (p,)
    np.testing.assert_allclose(one_value, values[0], rtol=1e-12)
    if model.gaussian_prior:
        with pytest.raises(ValueError, match="Gaussian prior"):
            model.log_prior_and_grad(theta, None)
    else:  # the Gaussian is only a stand-in: its own prior needs none
        np.testing.assert_allclose(model.log_prior_and_grad(theta, None)[0], values, rtol=1e-12)


def test_log_prior_and_grad_of_gaussian_mean_is_the_gaussian():
    model = make_model("gaussian-mean")
    mean, cov = np.array([0.5, -1.0, 2.0]), np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.2],
                                                      [0.0, 0.2, 0.5]])
    prior = G.from_moments(mean, cov)
    theta = np.random.default_rng(1).normal(size=(5, 3))
    values, grads = model.log_prior_and_grad(theta, prior)
    # two float64 implementations of the same density/gradient (TFP Cholesky vs scipy/solve)
    np.testing.assert_allclose(values, multivariate_normal(mean, cov).logpdf(theta), rtol=1e-10)
    np.testing.assert_allclose(grads, -np.linalg.solve(cov, (theta - mean).T).T, rtol=1e-10,
                               atol=1e-12)


# ------------------------------------------------------------------------------ mixture-1d


def test_mixture_log_likelihood_matches_scipy_for_both_rows():
    model = make_model("mixture-1d")
    assert model.param_dim(7) == 1 and not model.gaussian_prior and model.support == (-6.0, 6.0)
    theta = np.array([-6.0, -3.0, -0.4, 0.0, 1.0, 2.5, 6.0])
    want = np.stack([norm(1.0, 2.0).logpdf(theta),  # v = 4 is a variance: sd 2
                     np.log(norm(-3.0, 1.0).pdf(theta) + norm(3.0, np.sqrt(2.0)).pdf(theta))],
                    axis=1)
    x = tf.constant(MIXTURE_1D_ROWS)
    rows = model.log_likelihood_rows_tf(tf.constant(theta[:, None]), x,
                                        tf.zeros([2], tf.float64)).numpy()
    # log-sum-exp vs log of summed pdfs: rounding only
    np.testing.assert_allclose(rows, want, rtol=1e-12)
    np.testing.assert_allclose(mixture_1d_log_likelihood(MIXTURE_1D_ROWS, theta), want.sum(axis=1),
                               rtol=1e-12)
    # the zero-weight component of row 1 leaves values and gradients finite, far out too
    far = np.array([[-40.0], [0.0], [40.0]])
    values, grads = model.log_density_and_grad(far, MIXTURE_1D_ROWS, None)
    assert np.all(np.isfinite(values)) and np.all(np.isfinite(grads))


def test_mixture_uniform_prior():
    model = make_model("mixture-1d")
    theta = np.array([[-6.0], [-2.0], [0.0], [6.0], [-6.5], [7.0]])
    values, grads = model.log_prior_and_grad(theta, None)
    np.testing.assert_allclose(values[:4], -np.log(12.0), rtol=1e-15)
    assert np.all(values[4:] == -np.inf)  # outside the support: -inf (documented choice)
    assert np.all(grads == 0.0)
    # log_density_and_grad with the Gaussian stand-in uses the model's own (uniform) prior
    stand_in = model.prior(1, np.sqrt(12.0), diag=True)
    v_post, g_post = model.log_density_and_grad(theta[:4], MIXTURE_1D_ROWS, None, prior=stand_in)
    v_lik, g_lik = model.log_density_and_grad(theta[:4], MIXTURE_1D_ROWS, None)
    np.testing.assert_allclose(v_post, v_lik - np.log(12.0), rtol=1e-12)
    np.testing.assert_array_equal(g_post, g_lik)


def test_q_opt_density_and_kl():
    grid = mixture_1d_grid()
    assert grid.shape == (4001,) and grid[0] == -6.0 and grid[-1] == 6.0
    q_opt = mixture_1d_optimal_density(MIXTURE_1D_ROWS, grid)
    assert np.trapezoid(q_opt, grid) == pytest.approx(1.0, rel=1e-12)
    # trapezoid vs adaptive quadrature normaliser: error ~ (12 / 4000)^2 |f''| / 12 ~ 1e-6 rel
    np.testing.assert_allclose(q_opt, _q_opt_reference(grid), rtol=1e-5)
    # KL(q_opt || q_opt) = 0 up to rounding; an unnormalised log density is renormalised
    assert mixture_1d_kl(np.log(q_opt), MIXTURE_1D_ROWS, grid) < 1e-12
    assert mixture_1d_kl(np.log(q_opt) + 5.0, MIXTURE_1D_ROWS, grid) < 1e-12
    # another density: a standard normal, truncated; KL against a direct computation
    log_q = norm.logpdf(grid)
    kl = mixture_1d_kl(log_q, MIXTURE_1D_ROWS, grid)
    q = np.exp(log_q) / np.trapezoid(np.exp(log_q), grid)
    assert kl > 0.1
    np.testing.assert_allclose(kl, np.trapezoid(q * np.log(q / q_opt), grid), rtol=1e-9)
    # q vanishing on part of the grid (log q = -inf there) is allowed: 0 log 0 = 0
    log_half = np.where(grid > 0, 0.0, -np.inf)
    assert np.isfinite(mixture_1d_kl(log_half, MIXTURE_1D_ROWS, grid))


def test_mixture_metrics_on_samples_from_q_opt_give_a_small_kl():
    model = make_model("mixture-1d")
    samples = _samples_from_q_opt(2000, seed=0)
    metrics, diagram = model.metrics(SamplePosterior(samples[:, None]), MIXTURE_1D_ROWS, None)
    assert diagram is None and set(metrics) == {"kl", "mean"}
    # Independent computation: scipy's gaussian_kde (Scott's factor on the ddof=1 std in 1-D,
    # the same bandwidth as kde_bandwidth("auto")) on the grid, truncated and renormalised.
    grid = mixture_1d_grid()
    kde = gaussian_kde(samples)
    q = kde(grid) / np.trapezoid(kde(grid), grid)
    q_opt = mixture_1d_optimal_density(MIXTURE_1D_ROWS, grid)
    np.testing.assert_allclose(metrics["kl"], np.trapezoid(q * np.log(q / q_opt), grid),
                               rtol=1e-8)
    np.testing.assert_allclose(metrics["mean"], np.trapezoid(grid * q, grid), rtol=1e-10)
    # Tolerance: the KDE of exact samples is q_opt smoothed by a kernel of bandwidth
    # h = sd(q_opt) N^(-1/5) = 2.21 * 2000^(-0.2) = 0.48. For the narrowest mode (variance
    # about 0.8, agent 2's N(-3, 1) times agent 1's N(1, 4)) that smoothing alone costs
    # KL(N(0, 0.8 + h^2) || N(0, 0.8)) = (r - 1 - log r) / 2 = 0.018 with r = 1 + h^2 / 0.8,
    # an upper bound as the mode holds only part of the mass; sampling noise at N = 2000 adds
    # ~1e-3. 0.03 is below twice that bound and far below the KL of the wrong answers (agent 1's
    # local posterior 0.26, agent 2's 0.46).
    assert metrics["kl"] < 0.03
    assert abs(metrics["mean"] - np.trapezoid(grid * q_opt, grid)) < 0.2  # ~ 3 sd / sqrt(N)
    for row in MIXTURE_1D_ROWS:
        local = mixture_1d_optimal_density(row[None], grid)
        assert mixture_1d_kl(np.log(local), MIXTURE_1D_ROWS, grid) > 10 * metrics["kl"]


def test_mixture_metrics_of_a_gaussian_posterior_truncate_it():
    model = make_model("mixture-1d")
    post = GaussianPosterior(G.from_moments(np.array([0.7]), np.array([2.5])))
    metrics, _ = model.metrics(post, MIXTURE_1D_ROWS, None)
    grid = mixture_1d_grid()
    sd = np.sqrt(2.5)
    tn = truncnorm((-6.0 - 0.7) / sd, (6.0 - 0.7) / sd, loc=0.7, scale=sd)
    q = tn.pdf(grid) / np.trapezoid(tn.pdf(grid), grid)
    q_opt = mixture_1d_optimal_density(MIXTURE_1D_ROWS, grid)
    np.testing.assert_allclose(metrics["kl"], np.trapezoid(q * np.log(q / q_opt), grid),
                               rtol=1e-9)
    np.testing.assert_allclose(metrics["mean"], tn.mean(), atol=1e-6)  # trapezoid vs exact
    with pytest.raises(NotImplementedError, match="likelihood specifications"):
        model.predictive(post, MIXTURE_1D_ROWS)


# ---------------------------------------------------------------------- logistic-hyperprior


def test_logistic_hyperprior_log_prior_matches_scipy_and_finite_differences():
    model = make_model("logistic-hyperprior")
    assert model.param_dim(4) == 5 and not model.gaussian_prior and model.support is None
    rng = np.random.default_rng(2)
    theta = np.column_stack([rng.normal(size=(6, 4)), np.log([0.003, 0.01, 0.05, 0.5, 2.0, 30.0])])
    values, grads = model.log_prior_and_grad(theta, None)
    xi = np.exp(theta[:, -1])
    want = (norm(0.0, 1.0 / np.sqrt(xi[:, None])).logpdf(theta[:, :-1]).sum(axis=1)
            + gamma(a=1.0, scale=0.01).logpdf(xi) + theta[:, -1])  # Gamma(1, rate 100) + Jacobian
    np.testing.assert_allclose(values, want, rtol=1e-10)  # different formulas, rounding only
    fd = _fd_grad(lambda t: model.log_prior_and_grad(t, None)[0], theta)
    atol = 10 * np.finfo(np.float64).eps * np.max(np.abs(values)) / H
    np.testing.assert_allclose(grads, fd, rtol=1e-5, atol=atol)
    # closed form: d/dw = -xi w; d/dlog xi = d/2 - xi |w|^2 / 2 + (a - 1) - b xi + 1
    np.testing.assert_allclose(grads[:, :-1], -xi[:, None] * theta[:, :-1], rtol=1e-12)
    dlog = 2.0 - 0.5 * xi * np.sum(theta[:, :-1] ** 2, axis=1) - 100.0 * xi + 1.0
    np.testing.assert_allclose(grads[:, -1], dlog, rtol=1e-10, atol=1e-12)


def test_logistic_hyperprior_likelihood_and_predictive():
    model = make_model("logistic-hyperprior")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 3))
    y = (rng.random(7) < 0.5).astype(np.int64)
    theta = rng.normal(size=(4, 4))
    rows = model.log_likelihood_rows_tf(tf.constant(theta), tf.constant(x),
                                        tf.constant(y, tf.float64)).numpy()
    logits = theta[:, :-1] @ x.T  # no intercept: log xi is not a weight
    want = np.where(y == 1, -np.logaddexp(0.0, -logits), -np.logaddexp(0.0, logits))
    np.testing.assert_allclose(rows, want, rtol=1e-12)
    # the prior term of log_density_and_grad is the hyperprior, not the Gaussian stand-in
    stand_in = model.prior(3, 1.0, diag=True)
    v, _ = model.log_density_and_grad(theta, x, y, prior=stand_in)
    np.testing.assert_allclose(v, want.sum(axis=1) + model.log_prior_and_grad(theta, None)[0],
                               rtol=1e-12)
    # predictive: the average of sigmoid(x . w_s) over every particle
    post = SamplePosterior(theta)
    pred = model.predictive(post, x)
    np.testing.assert_allclose(pred.prob, (1.0 / (1.0 + np.exp(-logits))).mean(axis=0),
                               rtol=1e-12)
    metrics, diagram = model.metrics(post, x, y)
    # the metrics of that predictive, computed here: accuracy, mean NLL, Brier score (binary:
    # mean (p - y)^2) and the 10-bin ECE over the confidence max(p, 1 - p) in [0.5, 1]
    # (Guo et al. 2017, eq. 3); float round-off only
    p = (1.0 / (1.0 + np.exp(-logits))).mean(axis=0)
    correct = (p > 0.5) == y
    conf = np.maximum(p, 1 - p)
    bins = np.minimum(((conf - 0.5) / 0.05).astype(int), 9)
    ece = sum(np.mean(bins == b) * abs(correct[bins == b].mean() - conf[bins == b].mean())
              for b in range(10) if np.any(bins == b))
    want = {"test_accuracy": correct.mean(), "test_brier": np.mean((p - y) ** 2), "test_ece": ece,
            "test_nll": -np.mean(np.where(y == 1, np.log(p), np.log1p(-p)))}
    assert metrics.keys() == want.keys()
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12), key
    assert diagram["count"] == [int(np.sum(bins == b)) for b in range(10)]


# --------------------------------------------------------------------------------- datasets


def test_twonorm():
    a = 2.0 / np.sqrt(20.0)
    d = load_dataset("twonorm", "binary")
    assert d.x_train.shape == (5920, 20) and d.x_test.shape == (1480, 20)
    assert d.x_train.dtype == np.float64 and d.y_train.dtype == np.int64
    assert d.name == "twonorm" and d.holdout_rows == 0 and d.client_id is None
    x = np.concatenate([d.x_train, d.x_test])
    y = np.concatenate([d.y_train, d.y_test])
    assert np.bincount(y).tolist() == [3700, 3700]
    assert np.bincount(d.y_test).tolist() == [740, 740]  # stratified split
    for label, sign in ((1, 1.0), (0, -1.0)):
        means = x[y == label].mean(axis=0)
        # per coordinate the mean's standard error is 1 / sqrt(3700) = 0.016: 5 SE bounds
        np.testing.assert_allclose(means, sign * a, atol=5 / np.sqrt(3700))
        np.testing.assert_allclose(means.mean(), sign * a, atol=5 / np.sqrt(3700 * 20))
        # the sample sd of 3700 unit normals has standard error 1 / sqrt(2 (3700 - 1)) = 0.012:
        # 5 SE bounds (was 0.05, 4.3 SE, underived)
        np.testing.assert_allclose(x[y == label].std(axis=0), 1.0, atol=5 / np.sqrt(2 * 3699))
    # a fixed internal seed: the same data whatever the run seed; multiclass targets fit
    again = load_dataset("twonorm", "multiclass", seed=99)
    np.testing.assert_array_equal(again.x_train, d.x_train)
    np.testing.assert_array_equal(again.y_test, d.y_test)
    with pytest.raises(DataError, match="'twonorm' has binary labels"):
        load_dataset("twonorm", "real")


def test_mixture_1d_dataset_and_partition():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no holdout, so no DataWarning
        d = load_dataset("mixture-1d", "none", test_fraction=0.5)
    want = np.array([[1, 1, 4, 0, 0, 1], [1, -3, 1, 1, 3, 2]], dtype=np.float64)
    np.testing.assert_array_equal(d.x_train, want)
    np.testing.assert_array_equal(d.x_test, want)
    assert d.x_train.dtype == np.float64 and d.x_train.flags.c_contiguous
    assert d.y_train is None and d.y_test is None and d.holdout_rows == 0
    assert d.name == "mixture-1d"
    for target in ("real", "binary", "multiclass"):
        with pytest.raises(DataError, match="'mixture-1d' has no targets"):
            load_dataset("mixture-1d", target)
    # "dirichlet" is the configuration's default partition (alpha 0.5), "iid" the plain one:
    # both give each of the 2 clients one row (one agent's likelihood) for any seed
    from fedbayes_flwr.runtime.config import RunConfig

    assert RunConfig().partition == "dirichlet" and RunConfig().partition_alpha == 0.5
    for scheme in ("dirichlet", "iid"):
        for seed in range(5):
            parts = partition_indices(d, 2, scheme, alpha=0.5, seed=seed)
            assert sorted(p.tolist() for p in parts) == [[0], [1]], (scheme, seed)
