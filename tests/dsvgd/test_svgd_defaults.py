"""The metric, step schedule, bandwidth and divergence guard of fedbayes_flwr.algorithms.dsvgd.svgd
(``Whitening``, ``whitening``, ``diverged``, ``median_bandwidth``, ``scaled_svgd``, ``guarded_svgd``)
against values written out here from their docstrings: sample covariances as sums, Cholesky factors
checked through ``L L^T``, pairwise distances by a double loop, the AdaGrad rule and the rate
schedule by hand. Every expectation is exact up to float64 rounding (tolerances 1e-12 relative on
O(1) numbers, far below the 1e-8 ridge they must resolve); nothing is statistical.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from fedbayes_flwr.algorithms.dsvgd import svgd as sv

# the documented defaults, written out (module constants and ``adagrad_step``'s defaults)
RELATIVE, HALF_LIFE, EPS, BETA, GUARD_SPREAD, GUARD_RADIUS = 0.1, 20.0, 1e-9, 0.9, 10.0, 1e3


def sample_cov(s: np.ndarray) -> np.ndarray:
    """Unbiased sample covariance (``ddof = 1``) as a sum over rows."""
    n, d = s.shape
    m = s.sum(axis=0) / n
    c = np.zeros((d, d))
    for row in s:
        c += np.outer(row - m, row - m)
    return c / (n - 1)


def spread(x: np.ndarray) -> float:
    """Mean per-coordinate sample sd (``ddof = 1``), the docstrings' "spread"."""
    n = x.shape[0]
    m = x.sum(axis=0) / n
    return float(np.mean(np.sqrt(((x - m) ** 2).sum(axis=0) / (n - 1))))


def median_distance(x: np.ndarray) -> float:
    dists = sorted(float(np.sqrt(np.sum((x[i] - x[j]) ** 2)))
                   for i, j in itertools.combinations(range(len(x)), 2))
    k = len(dists)
    return dists[k // 2] if k % 2 else 0.5 * (dists[k // 2 - 1] + dists[k // 2])


def correlated(n: int, seed: int) -> np.ndarray:
    """``n`` rows of a correlated 2-D Gaussian (sds ~1.6 and ~0.9, correlation ~0.6), shifted."""
    z = np.random.default_rng(seed).standard_normal((n, 2))
    return z @ np.array([[1.5, 0.0], [0.6, 0.7]]).T + np.array([3.0, -1.0])


def assert_close(a, b, rtol=1e-12, atol=1e-13):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- Whitening


def test_identity_whitening_is_a_shift_by_the_mean():
    # root None: "the identity (z = x - mean)"; x = mean + z; scores unchanged
    w = sv.Whitening(np.array([1.5, -2.0]), None)
    x = np.array([[0.25, 3.0], [-1.0, 0.5], [4.0, -4.0]])
    assert_close(w.to_z(x), x - np.array([1.5, -2.0]))
    assert_close(w.to_x(np.array([[1.0, 2.0]])), [[2.5, 0.0]])
    assert_close(w.score_to_z(x), x)
    ident = sv.Whitening.identity(3)
    y = np.arange(6.0).reshape(2, 3)
    assert ident.root is None
    assert_close(ident.to_z(y), y)
    assert_close(ident.to_x(y), y)


def test_whitening_map_round_trip_and_score_chain_rule():
    # x = mean + z L^T, so z = L^-1 (x - mean) per row, solved here by forward substitution
    lower = np.array([[2.0, 0.0], [0.5, 1.5]])
    mean = np.array([1.0, -3.0])
    w = sv.Whitening(mean, lower)
    x = np.array([[3.0, 1.0], [-1.0, -2.5], [0.0, 7.0]])
    r = x - mean
    z1 = r[:, 0] / 2.0
    z2 = (r[:, 1] - 0.5 * z1) / 1.5
    z = np.stack([z1, z2], axis=1)
    assert_close(w.to_z(x), z)
    assert_close(w.to_x(z), x)
    assert_close(w.to_x(w.to_z(x)), x)
    # grad_z log p = L^T grad_x log p per particle: row g -> (2 g1 + 0.5 g2, 1.5 g2)
    g = np.array([[1.0, -2.0], [0.5, 4.0]])
    assert_close(w.score_to_z(g), [[2.0 - 1.0, -3.0], [1.0 + 2.0, 6.0]])


# --------------------------------------------------------------------------- whitening(sets)


def check_metric(w, mean, cov):
    """``w`` has mean ``mean`` and a lower-triangular root with ``L L^T = cov``."""
    assert_close(w.mean, mean)
    assert w.root is not None
    assert np.all(np.triu(w.root, 1) == 0.0)
    assert np.all(np.diag(w.root) > 0.0)
    assert_close(w.root @ w.root.T, cov)


def test_whitening_one_set_full_covariance_and_whitened_identity():
    s = correlated(7, seed=1)  # 7 > 2 d = 4 rows: full metric
    c = sample_cov(s)
    scale = (c[0, 0] + c[1, 1]) / 2.0
    w = sv.whitening([s])
    check_metric(w, s.sum(axis=0) / 7, c + 1e-8 * scale * np.eye(2))
    assert abs(c[0, 1]) > 0.1  # the off-diagonal term is really there
    # whitened sample covariance L^-1 C L^-T = I - 1e-8 scale (L L^T)^-1: identity within 1e-7
    zc = sample_cov(w.to_z(s))
    assert_close(zc, np.eye(2), rtol=0, atol=1e-7)
    assert abs(zc[0, 1]) < 1e-7 and abs(zc[0, 0] - 1.0) < 1e-7


def test_whitening_pools_the_mean_of_means_and_the_average_covariance():
    a, b = correlated(9, seed=2), correlated(6, seed=3) * 2.0 + 1.0
    c = (sample_cov(a) + sample_cov(b)) / 2.0  # average of the sets' covariances (not pooled rows)
    scale = np.trace(c) / 2.0
    mean = (a.mean(axis=0) + b.mean(axis=0)) / 2.0  # mean of the set means, not of the 15 rows
    assert np.max(np.abs(mean - np.vstack([a, b]).mean(axis=0))) > 1e-2
    w = sv.whitening([a, b])
    check_metric(w, mean, c + 1e-8 * scale * np.eye(2))
    # the same sets whitened diagonally: off-diagonals exactly zero
    wd = sv.whitening([a, b], full=False)
    check_metric(wd, mean, np.diag(np.diag(c)) + 1e-8 * scale * np.eye(2))
    assert_close(wd.root, np.diag(np.sqrt(np.diag(c) + 1e-8 * scale)))


@pytest.mark.parametrize("rows", [4, 3])
def test_whitening_is_diagonal_unless_every_set_has_more_than_2d_rows(rows):
    # a set with exactly 2 d = 4 rows (or fewer) makes the metric diagonal, even with full=True
    big, small = correlated(12, seed=4), correlated(rows, seed=5)
    c = (sample_cov(big) + sample_cov(small)) / 2.0
    scale = np.trace(c) / 2.0
    expect = np.diag(np.diag(c)) + 1e-8 * scale * np.eye(2)
    w = sv.whitening([big, small])
    check_metric(w, (big.mean(axis=0) + small.mean(axis=0)) / 2.0, expect)
    assert w.root[1, 0] == 0.0
    # whitened: each coordinate has unit average variance, to the ridge's 1e-8
    zc = (sample_cov(w.to_z(big)) + sample_cov(w.to_z(small))) / 2.0
    assert_close(np.diag(zc), [1.0, 1.0], rtol=0, atol=1e-7)


def test_whitening_degenerate_sets():
    # single-row sets count as covariance I (no sample covariance); 1 <= 2 d rows: diagonal
    rows = [np.array([[1.0, 2.0]]), np.array([[3.0, -2.0]])]
    w = sv.whitening(rows)
    check_metric(w, [2.0, 0.0], (1.0 + 1e-8) * np.eye(2))
    # no spread at all (scale 0) or a non-finite set: the mean and root = I exactly
    same = np.array([[1.0, -1.0]] * 5)
    w0 = sv.whitening([same])
    assert_close(w0.mean, [1.0, -1.0])
    assert np.array_equal(w0.root, np.eye(2))
    with np.errstate(invalid="ignore"):  # inf - inf inside the covariance
        wi = sv.whitening([np.array([[0.0, 1.0], [np.inf, 2.0], [1.0, 0.0]])])
    assert np.array_equal(wi.root, np.eye(2))


# --------------------------------------------------------------------------- diverged

START = np.array([[-2.0], [0.0], [2.0]])  # sd (ddof = 1) exactly 2; with ddof = 0 it is 1.63


def test_diverged_spread_threshold():
    # spread ratio 12.5 > GUARD_SPREAD = 10: reported with the ratio; 9.9 is not
    assert sv.diverged(START, START * 12.5) == "spread grew 12.5x"
    assert sv.diverged(START, START * 9.9) is None
    # N = 2 in d = 2: coordinate sds 1/sqrt(2) and 3/sqrt(2), spread sqrt(2)
    start2 = np.array([[0.0, 0.0], [1.0, 3.0]])  # sds 0.7071, 2.1213: spread 1.4142
    end_out = np.array([[0.0, 0.0], [10.5, 31.5]])  # exactly 10.5 x the deviations: 10.5x
    end_in = np.array([[0.0, 0.0], [9.5, 28.5]])
    assert sv.diverged(start2, end_out) == "spread grew 10.5x"
    assert sv.diverged(start2, end_in) is None
    assert sv.diverged(START, np.array([[0.0], [np.nan], [1.0]])) == "non-finite particles"
    assert sv.diverged(START, np.array([[0.0], [np.inf], [1.0]])) == "non-finite particles"


def test_diverged_radius_threshold():
    # start spread 2, start mean 0: a particle farther than GUARD_RADIUS * 2 = 2000 diverged
    assert sv.diverged(START, START + 2010.0) == "a particle 1.01e+03 spreads from the start"
    assert sv.diverged(START, START + 1996.0) is None  # farthest 1998 / 2 = 999
    assert sv.diverged(START, START - 2010.0) == "a particle 1.01e+03 spreads from the start"


def test_diverged_degenerate_starts():
    # coincident start (spread 0) and a single particle: the start spread counts as 1
    same = np.array([[5.0], [5.0], [5.0]])
    assert sv.diverged(same, same) is None
    assert sv.diverged(same, same + 999.0) is None
    assert sv.diverged(same, same + 1001.0) == "a particle 1e+03 spreads from the start"
    assert sv.diverged(same, np.array([[0.0], [11.0], [22.0]])) == "spread grew 11x"
    one = np.array([[1.0, -1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the documented N = 1 case computes no sd of one row
        assert sv.diverged(one, one + np.array([[0.0, 999.0]])) is None
        assert sv.diverged(one, one + np.array([[-1001.0, 0.0]])) == \
            "a particle 1e+03 spreads from the start"


# --------------------------------------------------------------------------- median_bandwidth

X4 = np.array([[0.0, 0.0], [3.0, 4.0], [1.0, 0.0], [0.0, 2.0]])


def test_median_bandwidth_is_scale_times_median_squared():
    med = median_distance(X4)  # distances 1, 2, 2.24, 3.61, 4.47, 5: median (sqrt 5 + sqrt 13) / 2
    assert med == pytest.approx((np.sqrt(5.0) + np.sqrt(13.0)) / 2.0, rel=1e-15)
    assert sv.median_bandwidth(X4) == pytest.approx(med * med, rel=1e-12)  # default scale 1
    assert sv.median_bandwidth(X4, 0.3) == pytest.approx(0.3 * med * med, rel=1e-12)
    with pytest.raises(ValueError):
        sv.median_bandwidth(X4, 0.0)


def test_median_bandwidth_degenerate_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # N = 1 has no pairs: no median of an empty list
        assert sv.median_bandwidth(np.array([[1.0, 2.0]])) == 1.0
        assert sv.median_bandwidth(np.array([[1.0, 2.0]]), 5.0) == 1.0
    # 4 of 5 coincide: 6 of the 10 pairs are zero, med = 0 -> 1.0 whatever the scale
    x = np.array([[1.0, 1.0]] * 4 + [[2.0, 3.0]])
    assert median_distance(x) == 0.0
    assert sv.median_bandwidth(x, 7.0) == 1.0


# --------------------------------------------------------------------------- scaled_svgd


def record_steps(monkeypatch):
    """Replace the inner AdaGrad step with a recorder that does not move the particles."""
    calls = []

    def step(state, phi, learning_rate, eps=None, first=None, beta=None):
        calls.append((float(learning_rate), eps, first, beta))
        return state, np.zeros_like(phi)

    monkeypatch.setattr(sv, "adagrad_step", step)
    return calls


def test_scaled_svgd_default_rate_schedule(monkeypatch):
    calls = record_steps(monkeypatch)
    x = np.array([[0.0, 1.0], [2.0, -1.0], [1.0, 4.0]])
    out = sv.scaled_svgd(x, lambda p: np.zeros_like(p), 6)
    assert_close(out, x)
    s = spread(x)
    assert [c[0] for c in calls] == pytest.approx(
        [RELATIVE * s / np.sqrt(1.0 + t / HALF_LIFE) for t in range(6)], rel=1e-13)
    assert [c[2] for c in calls] == [True] + [False] * 5  # a fresh AdaGrad state per loop
    assert all(c[1] == EPS and c[3] == BETA for c in calls)


def test_scaled_svgd_rate_with_t0_and_arguments(monkeypatch):
    calls = record_steps(monkeypatch)
    x = np.array([[0.0, 1.0], [2.0, -1.0], [1.0, 4.0], [-3.0, 0.5]])
    sv.scaled_svgd(x, lambda p: np.zeros_like(p), 4, relative=0.3, half_life=4.0, t0=7,
                   eps=1e-6, beta=0.5)
    s = spread(x)
    assert [c[0] for c in calls] == pytest.approx(
        [0.3 * s / np.sqrt(1.0 + (t + 7) / 4.0) for t in range(4)], rel=1e-13)
    assert [c[2] for c in calls] == [True, False, False, False]  # first is t == 0, not t + t0
    assert all(c[1] == 1e-6 and c[3] == 0.5 for c in calls)


def test_scaled_svgd_spread_fallbacks(monkeypatch):
    # one particle, or coincident particles (spread 0): the spread counts as 1
    calls = record_steps(monkeypatch)
    sv.scaled_svgd(np.array([[1.0, 2.0]]), lambda p: np.ones_like(p), 3)
    sv.scaled_svgd(np.array([[1.0, 2.0], [1.0, 2.0]]), lambda p: np.ones_like(p), 3)
    expect = [RELATIVE / np.sqrt(1.0 + t / HALF_LIFE) for t in range(3)]
    assert [c[0] for c in calls] == pytest.approx(expect + expect, rel=1e-13)


def test_scaled_svgd_bandwidth(monkeypatch):
    seen = []

    def direction(x, scores, h=None):
        seen.append(h)
        return np.zeros_like(x)

    monkeypatch.setattr(sv, "svgd_direction", direction)
    x = np.array([[0.0, 0.0], [3.0, 4.0]])  # one pair at distance 5
    sv.scaled_svgd(x, lambda p: np.zeros_like(p), 2)
    assert seen == [None, None]  # the median heuristic of svgd_direction
    sv.scaled_svgd(x, lambda p: np.zeros_like(p), 1, bandwidth_scale=2.0)
    assert seen[2] == pytest.approx(2.0 * 25.0, rel=1e-13)


def test_scaled_svgd_one_particle_moves_by_the_adagrad_rule():
    # N = 1: the SVGD direction is the score itself. Scores c_0, c_1, c_2 by call; by hand:
    # G_0 = c_0^2, G_t = beta G_{t-1} + (1 - beta) c_t^2, x += rate_t c_t / (eps + sqrt(G_t)),
    # rate_t = 0.1 * 1 / sqrt(1 + t / 20) (spread of one particle: 1)
    cs = [np.array([[1.0, -2.0]]), np.array([[3.0, 0.5]]), np.array([[-1.0, 4.0]])]
    it = iter(cs)
    x0 = np.array([[0.5, -0.25]])
    out = sv.scaled_svgd(x0, lambda p: next(it), 3)
    x, g = x0.copy(), None
    for t, c in enumerate(cs):
        g = c * c if t == 0 else BETA * g + (1.0 - BETA) * c * c
        x = x + RELATIVE / np.sqrt(1.0 + t / HALF_LIFE) * c / (EPS + np.sqrt(g))
    assert_close(out, x)
    # the first step alone is ~ rate_0 * sign(c_0): (0.5 + 0.1, -0.25 - 0.1)
    it = iter(cs)
    assert_close(sv.scaled_svgd(x0, lambda p: next(it), 1), [[0.6, -0.35]], rtol=1e-8)


# --------------------------------------------------------------------------- guarded_svgd


def test_guarded_svgd_shrinks_until_the_loop_holds():
    factors = []

    def run(f):  # spread grows by 1 + 200 f: 201x, 21x diverge, 3x holds
        factors.append(f)
        return START * (1.0 + 200.0 * f)

    x, rep = sv.guarded_svgd(run, START)
    assert factors == pytest.approx([1.0, 0.1, 0.01], rel=1e-15)
    assert_close(x, START * 3.0)
    assert rep.step_factor == pytest.approx(0.01, rel=1e-15) and rep.rollbacks == 2
    assert rep.reasons == ("spread grew 201x", "spread grew 21x")
    # a loop that holds at once: no rollback
    x, rep = sv.guarded_svgd(lambda f: START, START)
    assert rep == (1.0, 0, ())


def test_guarded_svgd_gives_up_after_retries():
    factors = []

    def run(f):
        factors.append(f)
        return START * 100.0

    x, rep = sv.guarded_svgd(run, START)  # retries 3, shrink 0.1: 4 attempts
    assert factors == pytest.approx([1.0, 0.1, 0.01, 0.001], rel=1e-15)
    assert rep.step_factor == pytest.approx(0.001, rel=1e-15)  # the last attempt's factor
    assert rep.rollbacks == 3 and rep.reasons == ("spread grew 100x",) * 4
    assert_close(x, START * 100.0)
    factors.clear()
    _, rep = sv.guarded_svgd(run, START, retries=1, shrink=0.5)
    assert factors == [1.0, 0.5] and rep == (0.5, 1, ("spread grew 100x",) * 2)
    # many retries: still exactly retries + 1 attempts and the last attempt's factor
    factors.clear()
    _, rep = sv.guarded_svgd(run, START, retries=300, shrink=0.5)
    assert len(factors) == 301 and factors[-1] == 0.5 ** 300
    assert rep.step_factor == 0.5 ** 300 and rep.rollbacks == 300 and len(rep.reasons) == 301


def test_guarded_svgd_check_rejects_and_retries():
    seen = []

    def check(x):
        seen.append(float(x[0, 0]))
        return "out of bounds" if x[0, 0] < -1.0 else None

    x, rep = sv.guarded_svgd(lambda f: START * f, START, check=check)
    assert seen == pytest.approx([-2.0, -0.2])
    assert rep.rollbacks == 1 and rep.reasons == ("out of bounds",)
    assert rep.step_factor == pytest.approx(0.1, rel=1e-15)
    assert_close(x, START * 0.1)


@pytest.mark.parametrize("full", [True, False])
def test_whitening_gives_a_coordinate_without_spread_the_mean_variance(full):
    # 7 rows, coordinate 1 constant: the sample covariance has a zero row and column there;
    # the documented metric gives it the mean variance scale = (var_0 + 0) / 2 (so its steps
    # are of the other coordinate's size), then the 1e-8 ridge on both. Before this was fixed
    # the check ran after the ridge and never fired (the coordinate got 1e-8 scale: frozen).
    x = np.column_stack([np.array([0.0, 1.0, -1.0, 2.0, 0.5, -0.5, 3.0]), np.full(7, 4.0)])
    var0 = sample_cov(x)[0, 0]
    scale = var0 / 2
    want = np.diag([var0, scale]) + 1e-8 * scale * np.eye(2)
    check_metric(sv.whitening([x], full=full), x.mean(axis=0), want)
