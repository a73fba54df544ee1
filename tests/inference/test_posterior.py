"""The posterior protocol: predictives from any posterior kind, exact Gaussian moments, sampler
diagnostics (ESS, R-hat) and distances to a reference posterior (marginal W1, KSD)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import tensorflow as tf
from scipy.stats import wasserstein_distance

from fedbayes_flwr.data import load_dataset
from fedbayes_flwr.evaluation.sample_quality import kernel_stein_discrepancy, ksd_of_posterior, posterior_w1
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import (
    PREDICTIVE_SAMPLES,
    GaussianPosterior,
    Posterior,
    SamplePosterior,
)
from fedbayes_flwr.models import exact_posterior, make_model
from tests.helpers.numpy_nets import numpy_forward

NUM_FEATURES = 3


class NumpyGaussian(Posterior):
    """A posterior kind defined only here: a mean-field Gaussian sampled with numpy. It does NOT
    declare ``gaussian = True``, so models must treat it through draws only."""

    def __init__(self, mean, std):
        self._m, self._s = np.asarray(mean, float), np.asarray(std, float)

    @property
    def dim(self):
        return self._m.shape[0]

    def sample(self, seed, n):
        rng = np.random.default_rng(np.asarray(seed, dtype=np.int64) & 0xFFFFFFFF)
        return self._m + self._s * rng.standard_normal((n, self.dim))

    def mean(self):
        return self._m

    def std(self):
        return self._s

    def save(self, path):
        np.savez(path, mean=self._m, std=self._s)


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _three_kinds(p: int, seed: int):
    """A Gaussian, a sample and a test-only posterior, all around the same mean-field Gaussian."""
    rng = np.random.default_rng(seed)
    mean, std = 0.5 * rng.normal(size=p), rng.uniform(0.1, 0.4, size=p)
    return {
        "gaussian": GaussianPosterior(G.from_moments(mean, std**2)),
        "samples": SamplePosterior(mean + std * rng.normal(size=(2, 60, p))),
        "test-only": NumpyGaussian(mean, std),
    }


def _metrics_of(pred, y):
    """The predictive metrics computed here from the predictive itself: classification accuracy,
    mean NLL, Brier score (binary: mean (p - y)^2; C classes: mean sum_c (p_c - [y = c])^2) and
    the 10-bin ECE over the confidence in [1/C, 1] (Guo et al. 2017, eq. 3); regression RMSE
    and the mean Gaussian predictive NLL."""
    if pred.prob is None:
        resid = y - pred.mean
        return {"test_rmse": np.sqrt(np.mean(resid**2)),
                "test_nll": np.mean(0.5 * np.log(2 * np.pi * pred.var) + resid**2 / (2 * pred.var))}
    probs = pred.prob if pred.prob.ndim == 2 else np.stack([1 - pred.prob, pred.prob], axis=1)
    c = probs.shape[1]
    onehot = np.eye(c)[y]
    brier = np.sum((probs - onehot) ** 2, axis=1)
    conf, correct = probs.max(axis=1), probs.argmax(axis=1) == y
    width = (1 - 1 / c) / 10
    bins = np.minimum(((conf - 1 / c) / width).astype(int), 9)
    ece = sum(np.mean(bins == b) * abs(correct[bins == b].mean() - conf[bins == b].mean())
              for b in range(10) if np.any(bins == b))
    return {"test_accuracy": correct.mean(), "test_nll": -np.mean(np.log(probs[np.arange(len(y)), y])),
            "test_ece": ece, "test_brier": np.mean(brier) / (2 if pred.prob.ndim == 1 else 1)}


@pytest.mark.parametrize("name", ["linear-regression", "logistic-regression", "bnn-classifier",
                                  "bnn-regression"])
@pytest.mark.parametrize("kind", ["gaussian", "samples", "test-only"])
def test_predictive_from_every_posterior_kind(name, kind):
    model = make_model(name, 0.5, (4,), 3)
    ds = load_dataset("synthetic", model.target, synthetic=model.synthetic, synthetic_size=40,
                      synthetic_dim=NUM_FEATURES, seed=2)
    x = ds.x_test
    post = _three_kinds(model.param_dim(NUM_FEATURES), seed=3)[kind]
    pred = model.predictive(post, x)
    metrics, _ = model.metrics(post, x, ds.y_test)
    want = _metrics_of(pred, ds.y_test)  # float round-off only
    assert metrics.keys() == want.keys()
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-10), key

    draws = post.draws()
    assert draws.shape == ((120 if kind == "samples" else PREDICTIVE_SAMPLES), post.dim)
    if name == "linear-regression":
        if kind == "gaussian":  # exact: mean x.m, variance sum_j x_j^2 s_j^2 + noise^2
            want_mean, want_var = x @ post.mean(), x**2 @ post.std() ** 2 + 0.25
        else:  # moments over the posterior's draws
            f = draws @ x.T
            want_mean, want_var = f.mean(axis=0), f.var(axis=0) + 0.25
        np.testing.assert_allclose(pred.mean, want_mean, rtol=1e-12)  # same formula, rounding
        np.testing.assert_allclose(pred.var, want_var, rtol=1e-12)
    elif name == "logistic-regression":
        design = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
        sig = _sigmoid(draws @ design.T)
        if kind == "gaussian":
            # Exact: under the mean-field Gaussian the activation a_i = design_i . w is
            # N(mu_i, v_i), mu_i = design_i . m, v_i = sum_j design_ij^2 s_j^2, so
            # p_i = int sigmoid(a) N(a; mu_i, v_i) da, computed here by adaptive quadrature
            # (scipy quad, a different rule from the library's Gauss-Hermite; quad's error
            # estimate < 1e-10). Tolerance 1e-8: the 64-node Gauss-Hermite rule on this smooth
            # integrand (poles of sigmoid at +-i pi, v_i < 1) is accurate to round-off; measured
            # max |pred - quad| ~ 1e-15. Power: shifting every mu_i by 0.01 moves p_i by
            # ~0.01 p(1 - p) >= 1e-4 here, far outside 1e-8 (checked below).
            from scipy.integrate import quad
            from scipy.stats import norm

            def exact_prob(shift):
                mu = design @ post.mean() + shift
                sd = np.sqrt(design**2 @ post.std() ** 2)
                return np.array([quad(lambda a, m=m, s=s: _sigmoid(a) * norm.pdf(a, m, s),
                                      m - 40 * s, m + 40 * s, epsabs=1e-13, epsrel=1e-13)[0]
                                 for m, s in zip(mu, sd, strict=True)])

            np.testing.assert_allclose(pred.prob, exact_prob(0.0), rtol=0, atol=1e-8)
            assert not np.allclose(pred.prob, exact_prob(0.01), rtol=0, atol=1e-8)
        else:  # the mean of the sigmoid over the draws, exactly
            np.testing.assert_allclose(pred.prob, sig.mean(axis=0), rtol=1e-12)
    else:
        sizes = model.layer_sizes(NUM_FEATURES)
        out = np.stack([numpy_forward(t, x, sizes) for t in draws])
        if name == "bnn-classifier":
            e = np.exp(out - out.max(axis=2, keepdims=True))
            want = (e / e.sum(axis=2, keepdims=True)).mean(axis=0)
            np.testing.assert_allclose(pred.prob, want, rtol=1e-10)  # TF vs numpy network
        else:
            np.testing.assert_allclose(pred.mean, out[..., 0].mean(axis=0), rtol=1e-10)
            np.testing.assert_allclose(pred.var, out[..., 0].var(axis=0) + 0.25, rtol=1e-10)


@pytest.mark.parametrize("diag", [True, False])
def test_gaussian_linear_moments_are_exact(diag):
    rng = np.random.default_rng(4)
    d, m, n = 5, 8, 20000
    mean = rng.normal(size=d)
    a = rng.normal(size=(d, d))
    cov = rng.uniform(0.5, 2.0, size=d) if diag else a @ a.T + 0.5 * np.eye(d)
    post = GaussianPosterior(G.from_moments(mean, cov))
    features = rng.normal(size=(m, d))
    got_mean, got_var = post.linear_moments(features)
    full = np.diag(cov) if diag else cov
    np.testing.assert_allclose(got_mean, features @ mean, rtol=1e-12)
    np.testing.assert_allclose(got_var, np.diag(features @ full @ features.T), rtol=1e-12)

    f = post.sample(np.array([1, 2], np.int32), n) @ features.T
    # Monte Carlo with n = 20000 draws: the mean's standard error is sqrt(var / n) and the
    # variance's is var * sqrt(2 / (n - 1)) for Gaussian activations; 4 standard errors on each of
    # the 8 features (fixed seed).
    assert np.all(np.abs(f.mean(axis=0) - got_mean) < 4 * np.sqrt(got_var / n))
    assert np.all(np.abs(f.var(axis=0) - got_var) < 4 * got_var * np.sqrt(2 / (n - 1)))
    # the protocol's default (Monte Carlo over the 100 predictive draws): 5 standard errors
    mc_mean, _ = Posterior.linear_moments(post, features)
    assert np.all(np.abs(mc_mean - got_mean) < 5 * np.sqrt(got_var / PREDICTIVE_SAMPLES))


def test_diagonal_gaussian_never_builds_a_dense_matrix():
    d, m = 20000, 4  # a dense d x d covariance would take 3.2 GB
    rng = np.random.default_rng(5)
    var = rng.uniform(0.5, 2.0, size=d)
    post = GaussianPosterior(G.from_moments(rng.normal(size=d), var))
    features = rng.normal(size=(m, d))
    y = rng.normal(size=m)
    tracemalloc.start()
    try:
        mean, lin_var = post.linear_moments(features)
        std = post.std()
        ell = make_model("linear-regression").expected_log_likelihood(post, features, y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # everything here is O(m d) = 80k floats (640 kB); 20 MB leaves room for temporaries but is
    # 160x below one dense d x d matrix
    assert peak < 20e6
    np.testing.assert_allclose(lin_var, features**2 @ var, rtol=1e-12)
    np.testing.assert_allclose(std, np.sqrt(var), rtol=1e-15)
    assert np.isfinite(ell) and mean.shape == (m,)


def test_sample_posterior_keeps_chains_and_saves_them(tmp_path):
    rng = np.random.default_rng(6)
    chains = rng.normal(size=(3, 50, 2))
    post = SamplePosterior(chains)
    assert post.chains.shape == (3, 50, 2) and post.samples.shape == (150, 2)
    np.testing.assert_array_equal(post.samples, chains.reshape(150, 2))
    np.testing.assert_array_equal(post.draws(), post.samples)
    assert post.draws(7).shape == (7, 2)
    post.save(tmp_path / "p.npz")
    with np.load(tmp_path / "p.npz") as z:
        assert set(z.files) == {"mean", "std", "samples", "chains"}
        np.testing.assert_array_equal(z["chains"], chains)
    assert SamplePosterior(chains[0]).chains.shape == (1, 50, 2)
    with pytest.raises(ValueError, match="shape"):
        SamplePosterior(np.zeros(5))
    # mean-field: the variance vector (O(d)); full covariance: the matrix
    GaussianPosterior(G.from_moments(np.zeros(2), np.ones(2))).save(tmp_path / "g.npz")
    with np.load(tmp_path / "g.npz") as z:
        assert {"mean", "std", "var", "eta1", "eta2"} == set(z.files)
    GaussianPosterior(G.from_moments(np.zeros(2), np.eye(2))).save(tmp_path / "f.npz")
    with np.load(tmp_path / "f.npz") as z:
        assert {"mean", "std", "cov", "eta1", "eta2"} == set(z.files)


def test_ess_and_rhat():
    rng = np.random.default_rng(7)
    n = 4000
    iid = SamplePosterior(rng.normal(size=(n, 3)))
    # The ESS estimate of iid draws has a relative sd of ~0.08 at n = 2000 (20 seeds, measured
    # when writing this test), smaller at n = 4000: +-25% is more than 3 sd.
    assert np.all(np.abs(iid.ess() / n - 1.0) < 0.25)
    assert np.isnan(iid.rhat()).all()  # R-hat needs two chains

    two = SamplePosterior(rng.normal(size=(2, n // 2, 3)))
    assert np.all(np.abs(two.ess() / n - 1.0) < 0.25)  # summed over chains, same bound
    # for two iid chains of 2000 draws R-hat ranged over [0.999, 1.007] (20 seeds): 0.02 is loose
    assert np.all(np.abs(two.rhat() - 1.0) < 0.02)
    diag = two.diagnostics()
    assert set(diag) == {"ess_min", "ess_mean", "rhat_max"}
    assert all(type(v) is float for v in diag.values())

    apart = rng.normal(size=(2, n // 2, 3))
    apart[1] += 1.0  # chains one standard deviation apart: R-hat ~ sqrt(1 + 1/4 / 1) ~ 1.1-1.9
    assert np.all(SamplePosterior(apart).rhat() > 1.1)

    ar = np.zeros((n, 3))
    eps = rng.normal(size=(n, 3))
    for t in range(1, n):
        ar[t] = 0.9 * ar[t - 1] + eps[t]
    # AR(1) with rho = 0.9 has ESS = n (1 - rho) / (1 + rho) ~ 0.053 n; 0.2 n flags correlation
    assert np.all(SamplePosterior(ar).ess() < 0.2 * n)


def test_marginal_w1():
    rng = np.random.default_rng(8)
    n, d = 2000, 3
    ref = rng.normal(size=(n, d))
    same = NumpyGaussian(np.zeros(d), np.ones(d))
    seed = np.array([3, 4], np.int32)
    w1 = posterior_w1(same, ref, seed=seed)
    draws = same.sample(seed, n)
    want = [wasserstein_distance(draws[:, j], ref[:, j]) for j in range(d)]
    np.testing.assert_allclose(w1, want, rtol=1e-14)  # the same scipy call on the same draws
    # E[W1] between two n = 2000 samples of N(0, 1) is ~ 0.03; a 0.5 shift moves W1 to ~ 0.5
    assert np.all(w1 < 0.1)
    shifted = posterior_w1(NumpyGaussian(np.full(d, 0.5), np.ones(d)), ref, seed=seed)
    assert np.all(shifted > 0.4)
    assert posterior_w1(same, ref, seed=seed, n=100).shape == (d,)
    with pytest.raises(ValueError, match="reference_draws"):
        posterior_w1(same, ref[:, :2])


def _stein_kernel_fd(x, y, sx, sy, beta=-0.5, c=1.0, h=1e-5):
    """The Stein kernel with every derivative of k taken by central differences."""
    def k(a, b):
        return (c**2 + np.sum((a - b) ** 2)) ** beta

    d = x.shape[0]
    e = np.eye(d) * h
    gx = np.array([(k(x + e[i], y) - k(x - e[i], y)) / (2 * h) for i in range(d)])
    gy = np.array([(k(x, y + e[i]) - k(x, y - e[i])) / (2 * h) for i in range(d)])
    trace = sum((k(x + e[i], y + e[i]) - k(x + e[i], y - e[i]) - k(x - e[i], y + e[i])
                 + k(x - e[i], y - e[i])) / (4 * h * h) for i in range(d))
    return sx @ sy * k(x, y) + sx @ gy + sy @ gx + trace


def test_kernel_stein_discrepancy_closed_form():
    rng = np.random.default_rng(9)
    x, s = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    want = np.mean([[_stein_kernel_fd(x[i], x[j], s[i], s[j]) for j in range(4)]
                    for i in range(4)])
    # finite differences of k with h = 1e-5: second-difference rounding ~ eps / h^2 ~ 1e-6
    assert kernel_stein_discrepancy(x, s) == pytest.approx(np.sqrt(want), rel=1e-5)
    with pytest.raises(ValueError, match="beta"):
        kernel_stein_discrepancy(x, s, beta=0.5)


def test_ksd_prefers_the_exact_posterior():
    model = make_model("linear-regression")
    ds = load_dataset("synthetic", "real", synthetic="linear", synthetic_size=100,
                      synthetic_dim=NUM_FEATURES, seed=0)
    prior = model.prior(NUM_FEATURES, 1.0, diag=False)
    exact = exact_posterior(model, prior, ds.x_train, ds.y_train)
    mean, cov = G.to_moments(exact)
    shifted = G.from_moments(mean + 2.0 * np.sqrt(np.diag(cov)), cov)  # 2 posterior sds off
    args = (model, ds.x_train, ds.y_train, prior)
    good = ksd_of_posterior(GaussianPosterior(exact), *args, n=500)
    bad = ksd_of_posterior(GaussianPosterior(shifted), *args, n=500)
    # a 2-sd shift of the mean is far outside the V-statistic's O(1/sqrt(n)) noise at n = 500
    assert good < 0.5 * bad


def test_scores_of_the_exact_posterior_are_its_gradient():
    # ties log_density_and_grad (prior on) to the conjugate posterior: grad log N(theta | m, S)
    model = make_model("linear-regression")
    ds = load_dataset("synthetic", "real", synthetic="linear", synthetic_size=50,
                      synthetic_dim=NUM_FEATURES, seed=1)
    prior = model.prior(NUM_FEATURES, 1.0, diag=False)
    exact = exact_posterior(model, prior, ds.x_train, ds.y_train)
    mean, cov = G.to_moments(exact)
    theta = np.random.default_rng(10).normal(size=(4, NUM_FEATURES))
    _, grads = model.log_density_and_grad(theta, ds.x_train, ds.y_train, prior=prior)
    want = -(theta - mean) @ np.linalg.inv(cov)
    np.testing.assert_allclose(grads, want, rtol=1e-9, atol=1e-9)  # conditioning-level rounding
    assert tf.is_tensor(model.log_prior_tf(theta, prior))
