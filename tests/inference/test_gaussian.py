"""Tier 1: natural-parameter algebra (round trips, products, projections, normalisers)."""

import numpy as np
import pytest
import tensorflow_probability as tfp

from fedbayes_flwr.inference import gaussian as G


def _random_gaussian(rng, d):
    a = rng.normal(size=(d, d))
    return rng.normal(size=d), a @ a.T + d * np.eye(d)


@pytest.mark.parametrize("d", [1, 3, 7])
def test_natural_moment_round_trip_full_and_diag(d):
    rng = np.random.default_rng(d)
    mean, cov = _random_gaussian(rng, d)
    m2, c2 = G.to_moments(G.from_moments(mean, cov))
    np.testing.assert_allclose(m2, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c2, cov, rtol=1e-12, atol=1e-12)
    var = np.diag(cov).copy()
    m3, v3 = G.to_moments(G.from_moments(mean, var))
    np.testing.assert_allclose(m3, mean, rtol=1e-12)
    np.testing.assert_allclose(v3, var, rtol=1e-12)


def test_product_of_gaussians_matches_precision_weighted_formula():
    rng = np.random.default_rng(0)
    (m1, c1), (m2, c2) = _random_gaussian(rng, 4), _random_gaussian(rng, 4)
    prod = G.add(G.from_moments(m1, c1), G.from_moments(m2, c2))
    p1, p2 = np.linalg.inv(c1), np.linalg.inv(c2)
    cov = np.linalg.inv(p1 + p2)
    mean = cov @ (p1 @ m1 + p2 @ m2)
    m, c = G.to_moments(prod)
    np.testing.assert_allclose(m, mean, rtol=1e-10)
    np.testing.assert_allclose(c, cov, rtol=1e-10)
    # the quotient undoes the product exactly
    back = G.sub(prod, G.from_moments(m2, c2))
    np.testing.assert_allclose(G.to_moments(back)[0], m1, rtol=1e-10)


def test_prior_times_factors_is_posterior_and_improper_factors_are_allowed():
    prior = G.from_moments(np.zeros(2), np.eye(2))
    # an indefinite factor (negative precision in one direction) is a legal t_k ...
    factor = G.make([1.0, 0.0], -0.5 * np.diag([3.0, -0.5]))
    assert not G.is_proper(factor)
    q = G.add(prior, factor)
    # ... as long as the posterior stays proper: precision diag(1 + 3, 1 - 0.5)
    np.testing.assert_allclose(G.precision(q), np.diag([4.0, 0.5]))
    with pytest.raises(ValueError, match="not positive definite"):
        G.check_proper(G.add(q, G.make([0, 0], -0.5 * np.diag([0.0, -1.0]))))


def test_log_partition_and_expected_dot_match_tfp():
    rng = np.random.default_rng(1)
    mean, cov = _random_gaussian(rng, 3)
    nat = G.from_moments(mean, cov)
    dist = tfp.distributions.MultivariateNormalFullCovariance(mean, cov)
    theta = rng.normal(size=3)
    # log N(theta) = eta . T(theta) - A(eta)
    log_density = nat.eta1 @ theta + theta @ nat.eta2 @ theta - G.log_partition(nat)
    np.testing.assert_allclose(log_density, dist.log_prob(theta).numpy(), rtol=1e-10)
    # E_q[eta . T] against Monte Carlo would be noisy; check against the moment formula
    other = G.from_moments(rng.normal(size=3), np.eye(3) * 2.0)
    expected = other.eta1 @ mean + np.sum(other.eta2 * (cov + np.outer(mean, mean)))
    np.testing.assert_allclose(G.expected_dot(other, nat), expected, rtol=1e-12)


def test_mean_field_projection_minimises_kl():
    rng = np.random.default_rng(2)
    mean, cov = _random_gaussian(rng, 3)
    p = G.from_moments(mean, cov)
    q = G.to_diag(p)
    qm, qv = G.to_moments(q)
    np.testing.assert_allclose(qm, mean, rtol=1e-10)
    np.testing.assert_allclose(1.0 / qv, np.diag(np.linalg.inv(cov)), rtol=1e-10)
    tfd = tfp.distributions
    target = tfd.MultivariateNormalFullCovariance(mean, cov)

    def kl(var):
        return tfd.kl_divergence(tfd.MultivariateNormalDiag(qm, np.sqrt(var)), target).numpy()

    best = kl(qv)
    for _ in range(5):  # any perturbation of the variances increases KL(q || p)
        assert kl(qv * np.exp(0.1 * rng.normal(size=3))) > best


def test_make_rejects_bad_shapes():
    with pytest.raises(ValueError, match="natural parameters"):
        G.make(np.zeros(3), np.zeros((2, 2)))
