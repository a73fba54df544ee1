"""The finite latent feature model's mean-field VB (fedbayes_flwr.inference.vb.latent_feature) and its
data."""

import itertools

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.stats import norm

from fedbayes_flwr.data.latent_features import make_latent_features
from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference.vb.latent_feature import LatentFeature, LatentFeatureParams

K, D, NOISE = 5, 10, 0.04


def matched_errors(estimate, truth):
    cost = np.linalg.norm(truth[:, None, :] - estimate[None, :, :], axis=-1)
    rows, cols = linear_sum_assignment(cost)
    return cost[rows, cols]


@pytest.fixture(scope="module")
def paper_data():
    """The paper's synthetic set (seed 1): 1000 training rows, 300 held out."""
    x, features, probs = make_latent_features(np.random.default_rng(1))
    return x[:1000], x[1000:], features, probs


@pytest.fixture(scope="module")
def paper_fit(paper_data):
    x, _, _, _ = paper_data
    base = LatentFeature(K, D, NOISE)
    model = LatentFeature(K, D, NOISE,
                          prior_precision=base.prior_precision_from_moments(base.data_moments(x)))
    return model, model.fit(x, model.prior(), np.random.default_rng(0), restarts=3)


def test_generator_matches_the_paper_setup():
    x, features, probs = make_latent_features(np.random.default_rng(3))
    assert x.shape == (1300, D) and features.shape == (K, D) and probs.shape == (K,)
    assert set(np.unique(features)) <= {0.0, 1.0}
    assert len(np.unique(features, axis=0)) == K and np.all(features.sum(axis=1) > 0)
    assert np.all((probs > 0) & (probs < 1))
    again = make_latent_features(np.random.default_rng(3))
    np.testing.assert_array_equal(x, again[0])


@pytest.mark.parametrize("warmup", [100, 0])
def test_elbo_never_decreases(warmup):
    x, _, _ = make_latent_features(np.random.default_rng(2), num_obs=300)
    model = LatentFeature(K, D, NOISE, warmup=warmup)
    trace = np.array(model.elbo_trace(x, model.prior(), np.random.default_rng(0), tol=1e-10,
                                      max_iter=200))
    # after the structured search the mean-field polish takes a sweep or two; from a random
    # start (warmup = 0) plain CAVI takes many
    assert len(trace) >= (2 if warmup else 10) and np.all(np.isfinite(trace))
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))


def test_structured_search_bound_never_decreases_and_bounds_the_elbo():
    """The warm-up's collapsed bound (exact joint q(z_n)) rises step by step and is never below
    the mean-field ELBO of the same global factors."""
    from fedbayes_flwr.inference.vb.latent_feature import _configs, _State

    x, _, _ = make_latent_features(np.random.default_rng(2), num_obs=300)
    model = LatentFeature(K, D, NOISE)
    rng = np.random.default_rng(1)
    state = _State(model, x, model.prior(), rng.integers(0, 2, size=(300, K)).astype(float))
    state.update_global()
    bounds = [state.structured_em(_configs(K), 0.0, 1) for _ in range(15)]
    assert np.all(np.diff(bounds) >= -1e-9 * np.abs(bounds[1:]))
    state.update_local()
    state.update_global()
    mean_field = state.elbo()
    assert state.structured_em(_configs(K), 0.0, 1) >= mean_field - 1e-9 * abs(mean_field)


def test_batch_fit_recovers_the_features(paper_data, paper_fit):
    _, _, features, probs = paper_data
    model, result = paper_fit
    assert result.converged and len(result.elbos) == 3 and result.elbo == max(result.elbos)
    errors = matched_errors(model.component_means(result.params), features)
    assert errors.max() < 0.15, errors
    # the inclusion probabilities come with the features (coupled labels)
    cost = np.linalg.norm(features[:, None] - model.component_means(result.params)[None], axis=-1)
    rows, cols = linear_sum_assignment(cost)
    np.testing.assert_allclose(expfam.mean(result.params.probs)[cols], probs[rows], atol=0.06)


def test_the_search_beats_plain_mean_field_restarts(paper_data, paper_fit):
    """Why fit() has a structured search: plain CAVI from random starts stalls far away."""
    x, _, features, _ = paper_data
    model, result = paper_fit
    plain = LatentFeature(K, D, NOISE, prior_precision=model.prior_precision, warmup=0)
    stalled = plain.fit(x, plain.prior(), np.random.default_rng(0), restarts=3)
    assert stalled.elbo < result.elbo - 100
    assert matched_errors(plain.component_means(stalled.params), features).max() > 0.5


def test_posterior_minus_prior_is_a_valid_contribution(paper_data, paper_fit):
    x = paper_data[0]
    model, result = paper_fit
    prior, post = model.prior(), result.params
    assert isinstance(post, LatentFeatureParams)
    assert np.all(post.features.prec - prior.features.prec >= 0)
    assert np.all(post.probs.a - prior.probs.a >= 0) and np.all(post.probs.b - prior.probs.b >= 0)
    # every row adds one count to each feature's Beta, and 1 / sigma^2 per unit of E[z]
    added = (post.probs.a - prior.probs.a) + (post.probs.b - prior.probs.b)
    np.testing.assert_allclose(added, len(x))
    np.testing.assert_allclose((post.features.prec - prior.features.prec) * NOISE,
                               post.probs.a - prior.probs.a)


def test_heldout_loglik_of_the_fit_beats_the_prior(paper_data, paper_fit):
    _, x_test, _, _ = paper_data
    model, result = paper_fit
    fitted = model.heldout_loglik(result.params, x_test)
    assert fitted > model.heldout_loglik(model.prior(), x_test) + 1.0
    assert fitted == model.heldout_loglik(result.params, x_test, seed=0)
    # the score does not depend on the features' labels (coupled permutation)
    perm = np.array([3, 0, 4, 1, 2])
    permuted = expfam.permute(result.params, perm, model.symmetric)
    assert model.heldout_loglik(permuted, x_test) == pytest.approx(fitted, rel=1e-12)


def test_heldout_enumeration_is_exact():
    """Against a direct sum over z with scipy densities (K = 2, D = 3)."""
    rng = np.random.default_rng(4)
    model = LatentFeature(2, 3, 0.1)
    params = LatentFeatureParams(
        expfam.IsoGaussian(rng.normal(size=(2, 3)) * 5.0, np.array([5.0, 8.0])),
        expfam.Beta(np.array([2.0, 3.0]), np.array([4.0, 1.5])))
    x = rng.normal(size=(6, 3))
    coords = np.random.default_rng(7).integers(0, 3, size=6)
    means, var_k = params.features.h / params.features.prec[:, None], 1 / params.features.prec
    pbar = params.probs.a / (params.probs.a + params.probs.b)
    expected = []
    for y, d in zip(x, coords, strict=True):
        num = den = 0.0
        for z in itertools.product((0, 1), repeat=2):
            z = np.array(z)
            mu, sd = z @ means, np.sqrt(0.1 + z @ var_k)
            weight = np.prod(pbar**z * (1 - pbar) ** (1 - z))
            weight *= np.prod([norm.pdf(y[j], mu[j], sd) for j in range(3) if j != d])
            den += weight
            num += weight * norm.pdf(y[d], mu[d], sd)
        expected.append(np.log(num / den))
    assert model.heldout_loglik(params, x, seed=7) == pytest.approx(np.mean(expected), rel=1e-10)


def test_gibbs_predictive_approximates_the_enumeration(paper_data, paper_fit):
    _, x_test, _, _ = paper_data
    model, result = paper_fit
    sampled = LatentFeature(K, D, NOISE, prior_precision=model.prior_precision, max_enumerate=0)
    exact = model.heldout_loglik(result.params, x_test[:100])
    assert sampled.heldout_loglik(result.params, x_test[:100]) == pytest.approx(exact, abs=0.05)


def test_a_non_default_prior_is_honoured(paper_data):
    """Features pinned by a sharp prior stay there; the Beta prior's counts add up."""
    x, _, features, _ = paper_data
    x = x[:200]
    model = LatentFeature(K, D, NOISE)
    pinned = 2.0 * features
    prec0 = np.full(K, 1e7)
    prior = LatentFeatureParams(expfam.IsoGaussian(prec0[:, None] * pinned, prec0),
                                expfam.Beta(np.arange(1.0, K + 1), np.full(K, 7.0)))
    result = model.fit(x, prior, np.random.default_rng(0))
    np.testing.assert_allclose(model.component_means(result.params), pinned, atol=1e-3)
    post = result.params
    assert np.all(post.probs.a >= prior.probs.a) and np.all(post.probs.b >= prior.probs.b)
    np.testing.assert_allclose(post.probs.a - prior.probs.a + post.probs.b - prior.probs.b, len(x))
    # the default prior on the same data finds different (the true) features
    free = model.fit(x, model.prior(), np.random.default_rng(0), restarts=2)
    assert matched_errors(model.component_means(free.params), pinned).mean() > 1.0


def test_prior_precision_from_summed_client_moments():
    x, _, _ = make_latent_features(np.random.default_rng(5), num_obs=1000)
    model = LatentFeature(K, D, NOISE)
    clients = np.array_split(x, [150, 400, 410, 800])
    moments = np.array([model.data_moments(part) for part in clients])
    pooled = model.prior_precision_from_moments(model.data_moments(x))
    assert model.prior_precision_from_moments(moments.sum(axis=0)) == pytest.approx(pooled,
                                                                                    rel=1e-12)
    assert model.prior_precision_from_moments(moments) == pytest.approx(pooled, rel=1e-12)
    assert pooled > 0


def test_prior_precision_estimator_is_consistent():
    """Data drawn from the prior model itself (sigma0^2 = 2, p = 1/2): nu0 close to 1/2."""
    rng = np.random.default_rng(6)
    n = 20000
    mu = rng.normal(scale=np.sqrt(2.0), size=(n, K, D))        # fresh features per row: iid moments
    z = rng.random((n, K)) < 0.5
    x = np.einsum("nk,nkd->nd", z, mu) + np.sqrt(NOISE) * rng.normal(size=(n, D))
    model = LatentFeature(K, D, NOISE)
    assert model.prior_precision_from_moments(model.data_moments(x)) == pytest.approx(0.5, rel=0.05)
    # floored at the noise: data with no signal give nu0 = 1 / sigma^2
    quiet = np.sqrt(NOISE) * rng.normal(size=(500, D)) * 0.5
    assert model.prior_precision_from_moments(model.data_moments(quiet)) == pytest.approx(1 / NOISE)


def test_prior_and_model_attributes():
    model = LatentFeature(K, D, NOISE, prior_precision=0.7)
    prior = model.prior()
    assert model.name == "latent-feature" and model.symmetric == ("features", "probs")
    assert model.num_components == K
    np.testing.assert_array_equal(prior.features.h, np.zeros((K, D)))
    np.testing.assert_array_equal(prior.features.prec, np.full(K, 0.7))
    np.testing.assert_array_equal(prior.probs.a, np.ones(K))
    np.testing.assert_array_equal(prior.probs.b, np.ones(K))
    np.testing.assert_array_equal(model.component_means(prior), np.zeros((K, D)))


def test_bad_inputs_raise():
    model = LatentFeature(K, D, NOISE)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="shape"):
        model.fit(np.zeros((10, D + 1)), model.prior(), rng)
    with pytest.raises(ValueError, match="non-finite"):
        model.fit(np.full((10, D), np.nan), model.prior(), rng)
    bad = model.prior()._replace(probs=expfam.Beta(np.zeros(K), np.ones(K)))
    with pytest.raises(ValueError, match="a must be > 0"):
        model.fit(np.zeros((10, D)), bad, rng)
    with pytest.raises(ValueError, match="noise_var"):
        LatentFeature(K, D, 0.0)
    with pytest.raises(ValueError, match="moments"):
        model.prior_precision_from_moments([0.0, 1.0])
