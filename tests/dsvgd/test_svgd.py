"""SVGD and Gaussian-KDE primitives (fedbayes_flwr.algorithms.dsvgd.svgd) against independent formulas."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from fedbayes_flwr.algorithms.dsvgd import svgd as sv
from fedbayes_flwr.inference import kde

# A 2-D Gaussian target N(M, S) used by the SVGD tests.
M = np.array([1.0, -2.0])
S = np.array([[1.0, 0.6], [0.6, 2.0]])
P = np.linalg.inv(S)


def gaussian_score(x: np.ndarray) -> np.ndarray:
    return -(x - M) @ P


def brute_bandwidth(x: np.ndarray) -> float:
    dists = sorted(
        float(np.sqrt(np.sum((x[i] - x[j]) ** 2)))
        for i, j in itertools.combinations(range(len(x)), 2)
    )
    k = len(dists)
    med = dists[k // 2] if k % 2 else 0.5 * (dists[k // 2 - 1] + dists[k // 2])
    return med * med / np.log(len(x))


def rbf(a: np.ndarray, b: np.ndarray, h: float) -> float:
    return float(np.exp(-np.sum((a - b) ** 2) / h))


def brute_direction(x: np.ndarray, s: np.ndarray, h: float) -> np.ndarray:
    n, d = x.shape
    phi = np.zeros((n, d))
    for i in range(n):
        for j in range(n):
            k = rbf(x[j], x[i], h)
            phi[i] += k * s[j] - 2.0 * (x[j] - x[i]) / h * k
    return phi / n


# --------------------------------------------------------------------------- bandwidth


@pytest.mark.parametrize("n", [7, 8, 30])  # 21, 28 (even: median averages two) and 435 pairs
def test_rbf_bandwidth_matches_double_loop(n):
    x = np.random.default_rng(n).normal(size=(n, 3))
    # Same distances, different summation order / median code: agreement to rounding.
    assert sv.rbf_bandwidth(x) == pytest.approx(brute_bandwidth(x), rel=1e-12)


def test_rbf_bandwidth_degenerate_cases():
    assert sv.rbf_bandwidth(np.array([[0.3, -1.0]])) == sv.DEGENERATE_RBF_BANDWIDTH == 1.0
    assert sv.rbf_bandwidth(np.full((5, 2), 4.2)) == 1.0  # all coincide: med = 0
    # 4 equal particles and one other: 6 of the 10 pairs have distance 0, so med = 0 too.
    x = np.vstack([np.zeros((4, 2)), [[1.0, 1.0]]])
    assert sv.rbf_bandwidth(x) == 1.0


def test_svgd_direction_with_coincident_particles_is_mean_score():
    x = np.full((4, 3), 0.7)
    s = np.random.default_rng(1).normal(size=(4, 3))
    phi = sv.svgd_direction(x, s)
    # k = 1 and zero kernel gradient between coincident particles: phi_i = mean_j s_j.
    np.testing.assert_allclose(phi, np.broadcast_to(s.mean(axis=0), s.shape), rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- SVGD direction


@pytest.mark.parametrize("h", [None, 0.7])
def test_svgd_direction_matches_double_loop(h):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, 3))
    s = rng.normal(size=(9, 3))
    want = brute_direction(x, s, sv.rbf_bandwidth(x) if h is None else h)
    # Vectorised vs scalar loop over the same formula: only summation-order rounding differs.
    np.testing.assert_allclose(sv.svgd_direction(x, s, h), want, rtol=0, atol=1e-12)


def test_kernel_gradient_term_matches_finite_differences():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 2))
    h = 1.3
    # With zero scores, phi is the repulsive term (1/N) sum_j grad_{x_j} k(x_j, x_i).
    repulsion = sv.svgd_direction(x, np.zeros_like(x), h)
    eps = 1e-5
    fd = np.zeros_like(x)
    for i in range(6):
        for j in range(6):
            for k in range(2):
                e = np.zeros(2)
                e[k] = eps
                fd[i, k] += (rbf(x[j] + e, x[i], h) - rbf(x[j] - e, x[i], h)) / (2 * eps)
    fd /= 6
    # Central differences: truncation ~eps^2 * |k'''| ~ 1e-10, rounding ~1e-16 / eps ~ 1e-11.
    np.testing.assert_allclose(repulsion, fd, rtol=0, atol=1e-8)


def test_single_particle_direction_is_the_score():
    x = np.array([[0.2, 3.0]])
    np.testing.assert_array_equal(sv.svgd_direction(x, gaussian_score(x)), gaussian_score(x))


# --------------------------------------------------------------------------- AdaGrad


def test_adagrad_first_and_later_steps_by_hand():
    lr = 0.1
    stale = sv.AdagradState(np.array([[100.0, 100.0]]))  # discarded by a first step
    state, delta = sv.adagrad_step(stale, np.array([[3.0, -4.0]]), lr, eps=0.0, first=True)
    np.testing.assert_array_equal(state.historical_grad, [[9.0, 16.0]])  # G = phi^2
    np.testing.assert_allclose(delta, [[0.1, -0.1]], rtol=1e-15)  # lr * phi / |phi|

    state, delta = sv.adagrad_step(state, np.array([[1.0, 2.0]]), lr, eps=0.0, first=False)
    # G = 0.9 * (9, 16) + 0.1 * (1, 4) = (8.2, 14.8).
    np.testing.assert_allclose(state.historical_grad, [[8.2, 14.8]], rtol=1e-15)
    np.testing.assert_allclose(delta, [[0.1 / np.sqrt(8.2), 0.2 / np.sqrt(14.8)]], rtol=1e-15)

    # eps is added to sqrt(G), not to G; a zero direction gives a zero step.
    state, delta = sv.adagrad_step(sv.adagrad_init((1, 2)), np.array([[0.0, 2.0]]), lr, eps=0.5,
                                   first=True)
    np.testing.assert_allclose(delta, [[0.0, 0.1 * 2.0 / 2.5]], rtol=1e-15)


def test_adagrad_rejects_shape_mismatch():
    with pytest.raises(ValueError):
        sv.adagrad_step(sv.adagrad_init((2, 3)), np.zeros((3, 2)), 0.1, 1e-9, True)


def test_svgd_loop_matches_hand_loop_with_recomputed_bandwidth():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(12, 2)) + 3.0
    lr, eps = 0.05, 1e-9
    y, g = x.copy(), None
    for t in range(5):
        phi = brute_direction(y, gaussian_score(y), brute_bandwidth(y))
        g = phi**2 if t == 0 else 0.9 * g + 0.1 * phi**2
        y = y + lr * phi / (eps + np.sqrt(g))
    # Same arithmetic up to summation order; 5 steps of size ~lr amplify nothing notable.
    np.testing.assert_allclose(sv.svgd(x, gaussian_score, 5, lr, eps), y, rtol=0, atol=1e-12)


def test_single_particle_svgd_is_gradient_ascent():
    x0 = np.array([[6.0, 6.0]])
    lr, eps = 0.02, 1e-9
    y, g = x0[0].copy(), None
    for t in range(50):
        grad = -P @ (y - M)  # gradient of log N(y | M, S)
        g = grad**2 if t == 0 else 0.9 * g + 0.1 * grad**2
        y = y + lr * grad / (eps + np.sqrt(g))
    np.testing.assert_allclose(sv.svgd(x0, gaussian_score, 50, lr, eps)[0], y, rtol=0, atol=1e-12)
    # Converges to the mode: near it AdaGrad-with-momentum steps stay ~lr in size (G tracks phi^2),
    # so the iterate ends in a 2-cycle of amplitude lr / 2 per coordinate (measured: exactly 0.01).
    far = sv.svgd(x0, gaussian_score, 1000, lr, eps)[0]
    assert np.max(np.abs(far - M)) <= lr


def test_svgd_recovers_a_2d_gaussian():
    rng = np.random.default_rng(0)
    x0 = 0.5 * rng.normal(size=(100, 2)) + np.array([6.0, 6.0])  # ~8 sd away from the mean M
    x = sv.svgd(x0, gaussian_score, 2000, 0.02)
    mean_err = np.max(np.abs(x.mean(axis=0) - M))
    cov = np.cov(x.T)
    cov_rel = np.linalg.norm(cov - S) / np.linalg.norm(S)
    # Measured over seeds 0-4 (lr 0.02, 2000 its): mean error 0.002-0.005, covariance relative
    # (Frobenius) error 0.069-0.072, variances 7% low (finite-N SVGD with the median heuristic
    # under-disperses). Bounds: 10x the mean error, ~3x the covariance error.
    assert mean_err < 0.05
    assert cov_rel < 0.20
    ratio = np.diag(cov) / np.diag(S)
    assert np.all((ratio > 0.8) & (ratio < 1.05))


# --------------------------------------------------------------------------- KDE


def direct_kde_log_density(x: np.ndarray, c: np.ndarray, bw: float) -> tuple[np.ndarray, np.ndarray]:
    """``log(mean_n exp(logpdf_n))`` summed directly (no log-sum-exp), and the ``(M, N)`` logpdfs."""
    d = c.shape[1]
    cov = bw**2 * np.eye(d)
    logpdf = np.stack([np.atleast_1d(multivariate_normal.logpdf(x, mean=cn, cov=cov)) for cn in c], axis=1)
    with np.errstate(divide="ignore"):
        return np.log(np.mean(np.exp(logpdf), axis=1)), logpdf


@pytest.mark.parametrize("bw", [0.55, 1.3])
def test_kde_log_density_matches_direct_formula(bw):
    rng = np.random.default_rng(6)
    c = rng.normal(size=(20, 3))
    x = 1.5 * rng.normal(size=(15, 3))
    want, _ = direct_kde_log_density(x, c, bw)
    assert np.all(np.isfinite(want))
    # log-sum-exp vs log(mean(exp)): same quantity, rounding only (values are O(1-10)).
    np.testing.assert_allclose(kde.kde_log_density(x, c, bw), want, rtol=0, atol=1e-12)


def test_kde_log_density_far_away_is_finite():
    rng = np.random.default_rng(7)
    bw = 0.55
    c = rng.normal(size=(20, 3))
    x = np.array([[1.0, 1.0, 1.0]]) * 1e3 * bw  # >= ~950 bandwidths from every centre
    assert np.min(np.linalg.norm(c - x, axis=1)) > 900 * bw
    direct, logpdf = direct_kde_log_density(x, c, bw)
    assert np.isneginf(direct[0])  # every exp(logpdf) underflows to 0
    got = kde.kde_log_density(x, c, bw)
    assert np.isfinite(got[0]) and got[0] < -1e5
    # Independent stable evaluation from scipy's per-centre log densities (values ~ -5e5).
    assert got[0] == pytest.approx(logsumexp(logpdf[0]) - np.log(20), rel=1e-12)


@pytest.mark.parametrize("bw", [0.55, 1.3])
def test_kde_score_matches_finite_differences(bw):
    rng = np.random.default_rng(8)
    c = rng.normal(size=(20, 3))
    x = 1.5 * rng.normal(size=(10, 3))
    eps = 1e-5
    fd = np.zeros_like(x)
    for k in range(3):
        e = np.zeros(3)
        e[k] = eps
        fd[:, k] = (kde.kde_log_density(x + e, c, bw) - kde.kde_log_density(x - e, c, bw)) / (2 * eps)
    # Central differences: truncation ~eps^2 / bw^3 ~ 1e-9, rounding ~1e-16 * |log p| / eps ~ 1e-10.
    np.testing.assert_allclose(kde.kde_score(x, c, bw), fd, rtol=0, atol=1e-6)


def test_kde_score_far_away_points_to_nearest_centre():
    rng = np.random.default_rng(9)
    bw = 0.55
    c = rng.normal(size=(20, 3))
    x = np.array([[1.0, 1.0, 1.0]]) * 1e3 * bw
    dist2 = np.sum((c - x) ** 2, axis=1)
    nearest = int(np.argmin(dist2))
    gap = (np.sort(dist2)[1] - dist2[nearest]) / (2 * bw**2)
    assert gap > 50  # the other centres' softmax weights are below exp(-50)
    score = kde.kde_score(x, c, bw)[0]
    assert np.all(np.isfinite(score))
    want = (c[nearest] - x[0]) / bw**2
    # All weight on the nearest centre up to exp(-gap); the rest is rounding.
    np.testing.assert_allclose(score, want, rtol=1e-12)


# --------------------------------------------------------------------------- KDE bandwidth


def test_kde_bandwidth_auto_is_scott_and_float_is_absolute():
    rng = np.random.default_rng(10)
    x = rng.normal(size=(50, 4)) * np.array([1.0, 2.0, 3.0, 4.0])
    std = np.sqrt(np.sum((x - x.mean(axis=0)) ** 2, axis=0) / 49)
    assert kde.kde_bandwidth(x) == pytest.approx(std.mean() * 50 ** (-1 / 8), rel=1e-12)
    assert kde.kde_bandwidth(10 * x, "auto") == pytest.approx(10 * kde.kde_bandwidth(x), rel=1e-12)
    assert kde.kde_bandwidth(x, 0.55) == 0.55 == kde.PAPER_KDE_BANDWIDTH
    assert kde.kde_bandwidth(10 * x, 0.55) == 0.55  # absolute: ignores the spread


def test_kde_bandwidth_degenerate_and_invalid():
    assert kde.kde_bandwidth(np.array([[1.0, 2.0]])) == kde.DEGENERATE_KDE_BANDWIDTH == 1.0
    assert kde.kde_bandwidth(np.full((6, 3), -2.0)) == 1.0
    assert kde.kde_bandwidth(np.array([[1.0, 2.0]]), 0.3) == 0.3
    for bad in (0.0, -1.0, float("nan"), float("inf"), "scott"):
        with pytest.raises(ValueError):
            kde.kde_bandwidth(np.zeros((3, 2)), bad)


# --------------------------------------------------------------------------- ratio of KDEs


def test_log_ratio_score():
    rng = np.random.default_rng(11)
    a, b, c = (rng.normal(loc=mu, size=(15, 2)) for mu in (0.0, 1.0, -1.0))
    x = rng.normal(size=(8, 2))
    assert np.all(kde.log_ratio_score(x, [(a, 0.55)], [(a, 0.55)]) == 0.0)
    got = kde.log_ratio_score(x, [(a, 0.55), (b, 0.8)], [(c, 0.6)])
    want = kde.kde_score(x, a, 0.55) + kde.kde_score(x, b, 0.8) - kde.kde_score(x, c, 0.6)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)

    # Independently: finite differences of the log ratio of the KDE log densities.
    def log_ratio(y):
        return (kde.kde_log_density(y, a, 0.55) + kde.kde_log_density(y, b, 0.8)
                - kde.kde_log_density(y, c, 0.6))

    eps = 1e-5
    fd = np.stack([(log_ratio(x + eps * e) - log_ratio(x - eps * e)) / (2 * eps) for e in np.eye(2)],
                  axis=1)
    np.testing.assert_allclose(got, fd, rtol=0, atol=1e-6)  # as in the kde_score FD test
    np.testing.assert_array_equal(kde.log_ratio_score(x, [], []), np.zeros_like(x))


def test_shrink_kde_variance_identities():
    """Centres scaled by a = 1 / sqrt(1 + h^2 / s^2): the KDE's variance (centres' variance plus
    h^2) is s^4 / (s^2 + h^2) + h^2; raised to a wider bandwidth it keeps that variance."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 1)) * 2.0
    s2 = float(x.var(ddof=1))
    h = 0.7
    k = kde.shrink_kde(kde.KDE(x, h))
    v = s2 * s2 / (s2 + h * h) + h * h
    assert k.bandwidth == h
    np.testing.assert_allclose(k.centres.var(ddof=1) + h * h, v, rtol=1e-12)
    np.testing.assert_allclose(k.centres.mean(0), x.mean(0), rtol=0, atol=1e-12)
    wide = kde.shrink_kde(kde.KDE(x, h), min_bandwidth=1.2)
    assert wide.bandwidth == 1.2
    np.testing.assert_allclose(wide.centres.var(ddof=1) + 1.2**2, v, rtol=1e-12)
    # wider than the variance allows: the centres collapse on their mean
    huge = kde.shrink_kde(kde.KDE(x, h), min_bandwidth=10.0)
    np.testing.assert_allclose(huge.centres, np.broadcast_to(x.mean(0), x.shape), atol=1e-12)


def test_paired_ratio_grows_at_most_linearly_in_the_tails():
    """A narrower denominator makes log(KDE_num / KDE_den) grow quadratically far away; the
    paired bandwidths (denominator at least as wide as its partner) keep it linear."""
    rng = np.random.default_rng(1)
    wide, narrow = rng.normal(size=(50, 1)) * 2.0, rng.normal(size=(50, 1)) * 0.5 + 1.0
    far = np.array([[20.0], [40.0], [80.0]])

    def log_ratio(num, den):
        return (kde.kde_log_density(far, num.centres, num.bandwidth)
                - kde.kde_log_density(far, den.centres, den.bandwidth))

    (n_own,), (d_own,) = kde.ratio_kdes([wide], [narrow], paired=False)
    (n_pair,), (d_pair,) = kde.ratio_kdes([wide], [narrow], paired=True)
    assert d_pair.bandwidth >= n_pair.bandwidth > d_own.bandwidth
    own, paired = log_ratio(n_own, d_own), log_ratio(n_pair, d_pair)
    # second differences over x = 20, 40, 80: quadratic growth doubles the slope, linear keeps it
    slopes_own = np.diff(own) / np.diff(far[:, 0])
    slopes_pair = np.diff(paired) / np.diff(far[:, 0])
    assert slopes_own[1] > 1.9 * slopes_own[0] > 0
    # linear up to the log-sum-exp corrections of the other centres, which vanish far away
    np.testing.assert_allclose(slopes_pair[1], slopes_pair[0], rtol=1e-2)
