"""DSVGD's bundle: exactness against centralised SVGD and U-DSVGD, P-DSVGD's one-client case,
client memory, rejected replies, and accuracy on a conjugate model (seed 001)."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

from fedbayes_flwr import codec, models
from fedbayes_flwr.algorithms.base import client_seed
from fedbayes_flwr.algorithms.dsvgd import bundle as D
from fedbayes_flwr.algorithms.dsvgd.svgd import svgd
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.tree import payload_nbytes
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

SMALL = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2,
         "local-iterations": 40, "distillation-iterations": 40, "batch-size": 0}


def _experiment(**values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_experiment(parse_run_config({**SMALL, **values}))


def _states(exp, rounds=None):
    return [state for _, state, _ in iterate_in_process(exp, rounds)]


def _particles(exp, rounds=None):
    return [s.particles for s in _states(exp, rounds)]


def test_one_client_one_round_is_centralised_svgd():
    """First round: q^(0) = t_k^(0) = KDE(theta^(0)), so the cavity scores cancel exactly and the
    target is p0 exp(-L); with the paper's settings (``dsvgd-paper``: Euclidean kernel, constant
    rate) the bundle must equal a plain SVGD loop on it to rounding, and with the defaults
    (Mahalanobis metric, scaled step) the svgd baseline's first round."""
    exp = _experiment(algorithm="dsvgd-paper", **{"num-clients": 1, "num-rounds": 1})
    (got,) = _particles(exp)
    setup, data = exp.setup, exp.client_data(0)
    x0 = D.initial_particles(setup)
    prior = setup.prior
    lr, eps = D.step_settings(setup, x0)

    def score(x):  # the exact Gaussian prior score plus the full-batch likelihood score
        lik = setup.model.log_density_and_grad(x, data.x, None, prior=None)[1]
        return prior.eta1 + 2.0 * prior.eta2 * x + lik

    want = svgd(x0, score, setup.config.local_iterations, lr, eps)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # and the svgd baseline's first round is the same loop
    (base,) = _particles(_experiment(algorithm="svgd-paper", **{"num-rounds": 1}))
    np.testing.assert_allclose(base, want, rtol=0, atol=1e-6)
    # the defaults: one client's first round is the svgd baseline's first round
    (got,) = _particles(_experiment(algorithm="dsvgd", **{"num-clients": 1, "num-rounds": 1}))
    (base,) = _particles(_experiment(algorithm="svgd", **{"num-rounds": 1}))
    np.testing.assert_allclose(got, base, rtol=0, atol=1e-9)


def test_first_pass_dsvgd_equals_u_dsvgd_then_they_differ():
    """Over the first pass every factor is still t_k^(0) in both variants (test: to 1e-12);
    on second visits the distilled and the exact factors differ."""
    common = {"num-clients": 3, "num-rounds": 5, "partition": "dirichlet",
              "partition-alpha": 0.5}
    a = _particles(_experiment(algorithm="dsvgd", **common))
    b = _particles(_experiment(algorithm="u-dsvgd", **common))
    for i in range(3):
        np.testing.assert_allclose(a[i], b[i], rtol=0, atol=1e-12)
    assert np.max(np.abs(a[4] - b[4])) > 1e-6


def test_p_dsvgd_with_one_client_per_round_is_dsvgd():
    """P-DSVGD's server takes the single upload itself: clients-per-round 1 = DSVGD exactly (bit
    for bit, every round). With every client each round the merge is P-DSVGD's own step: its
    target against the closed form in tests/dsvgd/test_dsvgd_mutants.py, its result against
    the exact posterior in :func:`test_p_dsvgd_one_round_matches_the_exact_posterior`."""
    common = {"num-clients": 3, "num-rounds": 3}
    a = _particles(_experiment(algorithm="dsvgd", **common))
    b = _particles(_experiment(algorithm="dsvgd", **common, **{"clients-per-round": 1}))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


# --- against the exact posterior: W1 of each marginal against N exact draws -------------------

_U = (np.arange(20_000) + 0.5) / 20_000  # quantile grid (midpoints) for W1 to a normal


def _w1_to_standard_normal(z) -> np.ndarray:
    """W1 between each column's empirical law and N(0, 1): ``int_0^1 |F_n^-1(u) - Phi^-1(u)| du``
    on a 20 000-point grid (quadrature error < 1e-3 sd)."""
    from scipy.stats import norm

    z = np.sort(np.atleast_2d(z), axis=0)
    n = z.shape[0]
    return np.mean(np.abs(z[np.minimum((_U * n).astype(int), n - 1)] - norm.ppf(_U)[:, None]), axis=0)


def _w1_bound(n, d, alpha=1e-3, reps=2000) -> float:
    """The ``1 - alpha / d`` quantile of W1(N iid exact draws, exact) per standardised marginal
    (simulated, fixed seed), so N exact draws pass all ``d`` marginals with probability
    ``>= 1 - alpha``: for N = 50 and d = 2, 0.50 posterior sd."""
    draws = np.random.default_rng(12345).standard_normal((n, reps))
    return float(np.quantile(_w1_to_standard_normal(draws), 1 - alpha / d))


def _check_exact(particles, exp, shift=0.0):
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None)
    mean, cov = G.to_moments(exact)
    sd = np.sqrt(np.diag(cov))
    w1 = _w1_to_standard_normal((particles - mean) / sd + shift)
    bound = _w1_bound(particles.shape[0], particles.shape[1])
    assert np.all(w1 <= bound), (f"W1 / posterior sd {np.round(w1, 3)} above {bound:.3f} (N exact "
                                 f"draws); mean error / sd {np.round((particles.mean(0) - mean) / sd, 3)}, "
                                 f"std ratio {np.round(particles.std(0, ddof=1) / sd, 3)}")


EXACT = {"num-clients": 3, "partition": "iid", "num-particles": 50, "seed": 0}


def test_svgd_baseline_matches_the_exact_posterior():
    """Centralised SVGD, N = 50, 2 x 150 iterations on gaussian-mean (d = 2): every marginal as
    close to the exact posterior as N exact draws (W1 bound above, 0.50 sd; measured mean error
    0.01 sd, std ratio 0.91-0.97). Power: the same particles shifted by 0.6 posterior sd fail."""
    exp = _experiment(algorithm="svgd", **{**EXACT, "num-rounds": 2, "local-iterations": 150})
    particles = _particles(exp)[-1]
    _check_exact(particles, exp)
    with pytest.raises(AssertionError, match="W1"):
        _check_exact(particles, exp, shift=0.6)


def test_dsvgd_matches_the_exact_posterior():
    """DSVGD itself against the exact posterior, the same bar as centralised SVGD above (issue
    26: failed with the paper's settings, W1 1.96 / 1.21 sd; passes with the settings that
    ``auto`` picks from d = 3 on, pinned here since d = 2 gets the paper's). Measured: W1 0.10 /
    0.12 sd against the 0.50 bound, mean error 0.05 / 0.07 sd, std ratio 1.01 / 1.04. Power: the
    same particles shifted by +-0.6 posterior sd fail (W1 0.65 / 0.67 for +0.6)."""
    exp = _experiment(algorithm="dsvgd", **{**EXACT, "num-rounds": 6, "local-iterations": 50,
                                            "distillation-iterations": 50,
                                            "kernel": "mahalanobis", "svgd-bandwidth": "median",
                                            "step": "scaled"})
    particles = _particles(exp)[-1]
    _check_exact(particles, exp)
    for shift in (0.6, -0.6):
        with pytest.raises(AssertionError, match="W1"):
            _check_exact(particles, exp, shift=shift)


def test_p_dsvgd_one_round_matches_the_exact_posterior():
    """Round 1 from prior particles: every client's target is ``p0 l_k`` (the cavity cancels), so
    the merge target ``p0^(1 - S) prod_k p0 l_k`` is the exact posterior (Kassab & Simeone 2022,
    Section 6), up to the KDE and SVGD errors that the bar allows for. Measured: W1 0.44 / 0.27
    sd against the 0.50 bound (close: the mean error -0.43 / 0.22 sd is 3.1 / 1.5 times the
    1 / sqrt(50) sd of N exact draws' mean), std ratio 0.86 / 0.90. Power: the same particles
    shifted by +-0.6 posterior sd fail (+0.6: W1 0.22 / 0.82; -0.6 moves the first marginal to
    about 1.0)."""
    exp = _experiment(algorithm="p-dsvgd", **{**EXACT, "num-rounds": 1, "local-iterations": 50})
    assert exp.setup.config.clients_per_round == 3
    particles = _particles(exp)[-1]
    _check_exact(particles, exp)
    for shift in (0.6, -0.6):
        with pytest.raises(AssertionError, match="W1"):
            _check_exact(particles, exp, shift=shift)


def test_memory_constant_for_dsvgd_and_grows_2nd_per_visit_for_u_dsvgd():
    """K = 2, 10 rounds: DSVGD's client factor never changes size; U-DSVGD's grows by exactly
    2 N d 8 bytes per visit (the client's new and received particle sets). What a node stores
    holds the committed factor and the pending one (commit on acknowledgement), so its record
    grows by twice that."""
    from flwr.common import RecordDict

    for algorithm, growth in (("dsvgd", 0), ("u-dsvgd", 1)):
        exp = _experiment(algorithm=algorithm, **{"num-clients": 2, "local-iterations": 5,
                                                  "distillation-iterations": 5})
        setup = exp.setup
        n, d = D.num_particles(setup), setup.prior.dim
        state = exp.bundle.init_client(setup, 0)
        server = exp.bundle.init_server(setup)
        sizes = []
        for number in range(1, 11):
            rnd_requests = D.schedule(setup, number)
            if 0 not in rnd_requests:
                continue
            request = D.Request(D.TRAIN, D.Down(server.particles, number,
                                                number - 2 if number > 1 else -1))
            seed = client_seed(setup.run_seed, "dsvgd", "train", number, 0)
            state, reply, _ = exp.bundle.client_step(seed, state, request, exp.client_data(0),
                                                     setup)
            # what the node stores (and reloads, shape-free) in context.state
            records = RecordDict()
            codec.save_state(records, "dsvgd", state)
            loaded = codec.load_state(records, "dsvgd", exp.bundle.client_state_template(setup))
            np.testing.assert_array_equal(loaded.pending.numerators, state.pending.numerators)
            sizes.append((payload_nbytes(state.pending), codec.received_nbytes(records)))
        assert len(sizes) == 5
        factor, stored = np.diff(np.array(sizes), axis=0).T
        assert np.all(factor == growth * 2 * n * d * 8), (algorithm, sizes)
        assert np.all(stored == 2 * factor), (algorithm, sizes)


def test_bad_replies_are_rejected_and_leave_state_untouched():
    """Wrong shape and NaN particles: rejected with the partition and field named, the global
    particles unchanged, the client's factor not committed (the next request says so)."""
    from fedbayes_flwr.runtime.steps import judge

    exp = _experiment(algorithm="dsvgd", **{"num-clients": 2})
    setup, bundle = exp.setup, exp.bundle
    server = bundle.init_server(setup)
    good = D.Up(server.particles + 0.1, 1)
    bad_shape = D.Up(server.particles[:-1], 1)
    bad_nan = D.Up(np.where(np.arange(server.particles.size).reshape(server.particles.shape)
                            == 0, np.nan, server.particles), 1)
    for reply, field in ((bad_shape, "particles"), (bad_nan, "particles")):
        verdict = judge(bundle, setup, exp.actions, server, 1, "train", reply)
        assert verdict.partition_id == 1 and verdict.field == field, verdict
        new, info = bundle.server_step(server, [(1, verdict)], setup, None)
        np.testing.assert_array_equal(new.particles, server.particles)
        assert new.accepted_round[1] == -1 and info.rejected == (verdict,)
    assert judge(bundle, setup, exp.actions, server, 1, "train", good) is good


# --- U-DSVGD, 10 non-iid clients: medians over 10 seed-coordinates against N exact draws ------
#
# For N iid draws from the exact posterior N(mean, diag(sd^2)) (diagonal here, so coordinates are
# independent, and so are the seeds), per coordinate (a) the mean error in sd units is Z / sqrt(N),
# Z ~ N(0, 1), so |error| has CDF F(c) = 2 Phi(c sqrt(N)) - 1, and (b) the sample-sd ratio r has
# (N - 1) r^2 ~ chi^2(N - 1), CDF G(r) = chi2.cdf((N - 1) r^2, N - 1). For m = 10 such iid values,
# the median (the average of the 5th and 6th order statistics) lies between X_(5) and X_(6), and
# F(X_(k)) is the k-th order statistic of 10 uniforms, ~ Beta(k, 11 - k). Hence
#   P(median > c) <= P(X_(6) > c) = P(Beta(6, 5) > F(c)),  P(median < c) <= P(Beta(5, 6) < F(c)),
# so the bars below are passed by N exact draws with probability >= 1 - alpha (exact bounds, no
# simulation; for N = 50, alpha = 1e-3: |mean error| median <= 0.240 sd, std-ratio median in
# [0.853, 1.140]; a fixed-seed check of 20 000 replicates is test_median_bars_... below).
ALPHA = 1e-3
UDSVGD_N, UDSVGD_SEEDS = 50, 5


def _median_error_bar(n, m=10, alpha=ALPHA) -> float:
    """Largest median |mean error| (posterior sd) of ``m`` coordinates that N exact draws exceed
    with probability ``<= alpha``: ``F^-1(Beta(m/2 + 1, m/2).ppf(1 - alpha))``."""
    from scipy.stats import beta, norm

    u = beta.ppf(1 - alpha, m // 2 + 1, m - m // 2)
    return float(norm.ppf((1 + u) / 2) / np.sqrt(n))


def _median_ratio_bars(n, m=10, alpha=ALPHA) -> tuple[float, float]:
    """Range the median std ratio of ``m`` coordinates of N exact draws leaves with probability
    ``<= alpha`` (``alpha / 2`` each side): ``G^-1`` of the Beta(5, 6) and Beta(6, 5) quantiles."""
    from scipy.stats import beta, chi2

    lo = beta.ppf(alpha / 2, m // 2, m - m // 2 + 1)
    hi = beta.ppf(1 - alpha / 2, m // 2 + 1, m - m // 2)
    return tuple(float(np.sqrt(chi2.ppf(u, n - 1) / (n - 1))) for u in (lo, hi))


def _median_stats(z) -> tuple[float, float]:
    """``z``: ``(seeds, N, d)`` particles in posterior-sd units about the exact mean: the median
    over every seed-coordinate of ``|mean error|`` and of the sample-sd ratio."""
    return float(np.median(np.abs(z.mean(axis=1)))), float(np.median(z.std(axis=1, ddof=1)))


def test_median_bars_pass_exact_draws_and_reject_shifted_or_narrow_ones():
    """The two bars on 20 000 fixed-seed replicates of 5 seeds x 2 coordinates x N = 50 exact
    draws: rejected in <= alpha = 1e-3 of them (measured 0.0002 each: the bounds are
    conservative); power: the mean bar rejects draws shifted by 0.3 sd in >= 80% (measured 87%),
    the ratio bar draws with the sd scaled by 0.7 in >= 99% (measured 100%; 0.8: 97%; 0.85: 60%)."""
    n = UDSVGD_N
    z = np.random.default_rng(2024).standard_normal((20_000, 10, n))
    errors, ratios = np.median(np.abs(z.mean(axis=2)), axis=1), np.median(z.std(axis=2, ddof=1), axis=1)
    bar = _median_error_bar(n)
    lo, hi = _median_ratio_bars(n)
    assert np.mean(errors > bar) <= ALPHA and np.mean((ratios < lo) | (ratios > hi)) <= ALPHA
    assert np.mean(np.median(np.abs(z.mean(axis=2) + 0.3), axis=1) > bar) >= 0.8
    assert np.mean(0.7 * ratios < lo) >= 0.99


@functools.cache
def _u_dsvgd_ten_non_iid_clients() -> np.ndarray:
    """U-DSVGD, N = 50, 10 Dirichlet(0.5) clients, 3 passes (30 rounds), seeds 0-4: the final
    particles standardised by each seed's exact posterior, ``(5, N, 2)``."""
    out = []
    for seed in range(UDSVGD_SEEDS):
        exp = _experiment(algorithm="u-dsvgd", **{
            "num-clients": 10, "num-rounds": 30, "partition": "dirichlet",
            "partition-alpha": 0.5, "local-iterations": 200, "distillation-iterations": 200,
            "batch-size": 100, "num-particles": UDSVGD_N, "seed": seed})
        particles = _particles(exp)[-1]
        exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None)
        mean, cov = G.to_moments(exact)
        assert np.count_nonzero(cov - np.diag(np.diag(cov))) == 0  # independent coordinates
        out.append((particles - mean) / np.sqrt(np.diag(cov)))
    return np.stack(out)


@pytest.mark.slow
def test_u_dsvgd_gaussian_mean_ten_non_iid_clients_three_passes_mean():
    """U-DSVGD's particle means against the exact posterior: the median over the 10
    seed-coordinates of |mean error| within the bar N exact draws pass with probability
    >= 1 - 1e-3 (0.240 sd, derivation above). Measured: median 0.092 sd, like N exact draws
    (median 0.6745 / sqrt(50) = 0.095), per coordinate 0.004-0.569 (seed 1's first: 0.57,
    seed 4's: 0.31). Centralised SVGD on the same data (3 x 200 iterations) is far better than
    N exact draws: median 0.0075 sd. Power: the same particles shifted by 0.3 sd fail (median
    0.33). (The issue's original bar, every coordinate within 0.3 sd and 25% for every seed, is
    met by 2 of 5 seeds: benchmarks/dsvgd/dsvgd_gaussian_mean.py and the README table.)"""
    z = _u_dsvgd_ten_non_iid_clients()
    bar = _median_error_bar(UDSVGD_N)
    error, _ = _median_stats(z)
    assert error <= bar, (error, bar, np.round(z.mean(axis=1), 3))
    shifted, _ = _median_stats(z + 0.3)
    assert shifted > bar, (shifted, bar)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "known gap, issue 26 (DSVGD made sound): U-DSVGD (paper's settings at d = 2) is narrower "
    "than N exact draws: median std "
    "ratio 0.819 (per coordinate 0.77-0.97) below the 0.853 that N = 50 exact draws stay above "
    "with probability >= 1 - 5e-4; centralised SVGD on the same data: 0.951. The d >= 3 settings "
    "(Mahalanobis kernel, median bandwidth, scaled step) are worse here: 0.593"))
def test_u_dsvgd_gaussian_mean_ten_non_iid_clients_three_passes_std():
    """U-DSVGD's particle spread against the exact posterior: the median over the 10
    seed-coordinates of the sample-sd ratio within the range N exact draws stay in with
    probability >= 1 - 1e-3 ([0.853, 1.140], derivation above). Power: the bar rejects N exact
    draws with the sd scaled by 0.7 in 100% of replicates
    (:func:`test_median_bars_pass_exact_draws_and_reject_shifted_or_narrow_ones`)."""
    z = _u_dsvgd_ten_non_iid_clients()
    lo, hi = _median_ratio_bars(UDSVGD_N)
    _, ratio = _median_stats(z)
    assert lo <= ratio <= hi, (ratio, (lo, hi), np.round(z.std(axis=1, ddof=1), 3))


def _best_gaussian_kl(rows) -> float:
    """The smallest KL(q || q_opt) any Gaussian q (truncated to [-6, 6]) reaches: a floor for
    PVI and global VI, whose q is Gaussian."""
    from scipy.optimize import minimize
    from scipy.stats import norm

    from fedbayes_flwr.models import mixture

    grid = mixture.mixture_1d_grid()

    def kl(p):
        return mixture.mixture_1d_kl(norm.logpdf(grid, p[0], np.exp(p[1])), rows, grid)

    return min(minimize(kl, [m, np.log(s)], method="Nelder-Mead").fun
               for m in (-3.0, 0.0, 2.5) for s in (1.0, 2.5))


def _kde_kl(x, q_opt, grid) -> np.ndarray:
    """The ``mixture-1d`` metric, KL(KDE(x) || q_opt), for each row of ``x`` (``(R, N)`` draws
    inside the grid), vectorised: Scott's bandwidth ``std(ddof=1) N^(-1/5)``, the Gaussian KDE on
    the uniform grid by linear binning and an FFT convolution (binning error O(dx^2 / h^2),
    measured 1.5e-7 nats against the metric), renormalised on [-6, 6], trapezoid KL."""
    r, n = x.shape
    m, dx = grid.size, grid[1] - grid[0]
    size = 1 << (3 * m).bit_length()  # a power of 2 >= 3 m: no wrap-around of the +-(m - 1) lags
    lag = np.fft.fftfreq(size, 1.0 / size) * dx
    h = x.std(axis=1, ddof=1) * n ** -0.2
    pos = (x - grid[0]) / dx
    k = np.minimum(pos.astype(int), m - 2)
    frac = pos - k
    idx = (np.arange(r)[:, None] * size + k).ravel()
    w = (np.bincount(idx, (1 - frac).ravel(), r * size)
         + np.bincount(idx + 1, frac.ravel(), r * size)).reshape(r, size)
    kernel = np.exp(-0.5 * (lag[None, :] / h[:, None]) ** 2)
    p = np.fft.irfft(np.fft.rfft(w, axis=1) * np.fft.rfft(kernel, axis=1), size, axis=1)[:, :m]
    p = np.maximum(p, 1e-300)
    p /= np.trapezoid(p, grid, axis=1)[:, None]
    return np.trapezoid(p * np.log(p / q_opt), grid, axis=1)


def _exact_mixture_draws(rng, shape, q_opt, grid) -> np.ndarray:
    """Draws from q_opt by inverting its trapezoid CDF on the grid (piecewise-linear: the density
    piecewise constant on cells of 0.003, a KL of O(dx^2) from q_opt)."""
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (q_opt[1:] + q_opt[:-1]) * np.diff(grid))])
    return np.interp(rng.random(shape), cdf / cdf[-1], grid)


def _mixture_kl_bar(model, rows, n, alpha=ALPHA, reps=20_000) -> float:
    """The ``1 - alpha`` quantile of the metric KL(KDE(N exact draws) || q_opt) over ``reps``
    fixed-seed replicates (N = 200, alpha = 1e-3: 0.106 nats; median 0.042; 200 stratified
    draws, KDE bias only: 0.036). The vectorised statistic is first checked against the
    model's own metric on 5 of the replicates (to 1e-5 nats)."""
    from fedbayes_flwr.inference.posterior import SamplePosterior
    from fedbayes_flwr.models.mixture import mixture_1d_grid, mixture_1d_optimal_density

    grid = mixture_1d_grid()
    q_opt = mixture_1d_optimal_density(rows, grid)
    x = _exact_mixture_draws(np.random.default_rng(31), (reps, n), q_opt, grid)
    metric = [model.metrics(SamplePosterior(row[:, None]), rows)[0]["kl"] for row in x[:5]]
    np.testing.assert_allclose(_kde_kl(x[:5], q_opt, grid), metric, rtol=0, atol=1e-5)
    kls = np.concatenate([_kde_kl(x[i:i + 500], q_opt, grid) for i in range(0, reps, 500)])
    return float(np.quantile(kls, 1 - alpha))


@pytest.mark.slow
def test_mixture_1d_u_dsvgd_as_close_as_exact_draws_and_below_every_gaussian():
    """The paper's toy (N = 200, 10 rounds): U-DSVGD's and centralised SVGD's KL(KDE || q_opt)
    each no larger than N exact draws from q_opt reach with probability 1 - 1e-3 (the same
    metric on them: :func:`_mixture_kl_bar`, 0.106 nats), and U-DSVGD's below the best KL any
    Gaussian q reaches (so below PVI and global VI whatever their optimiser). Measured (seed 0,
    benchmarks/dsvgd/dsvgd_mixture_1d.py): U-DSVGD 0.070 (about the 95th percentile of N exact
    draws), SVGD 0.057, DSVGD (not asserted) 1.87, the bar 0.106, the Gaussian floor 0.220.
    Power: U-DSVGD's particles shifted by +0.5 (0.23 posterior sd) fail the bar (KL 0.186; by
    -0.5 they would not, 0.087; SVGD's by +0.5 just do, 0.111): 0.23 sd is about the smallest
    shift this bar detects. (This replaces "within 0.05 nats of SVGD", a margin with no
    derivation.)"""
    from fedbayes_flwr.inference.posterior import SamplePosterior

    finals, particles = {}, {}
    for algorithm in ("u-dsvgd", "svgd"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exp = build_experiment(parse_run_config({
                "algorithm": algorithm, "model": "mixture-1d", "dataset": "mixture-1d",
                "num-clients": 2, "num-rounds": 10, "prior-scale": float(np.sqrt(12.0))}))
        state = _states(exp)[-1]
        posterior = exp.bundle.posterior(state, exp.setup)
        metrics, _ = exp.model.metrics(posterior, exp.dataset.x_test, None)
        finals[algorithm], particles[algorithm] = metrics["kl"], np.asarray(posterior.draws())
    rows = exp.dataset.x_test
    bar = _mixture_kl_bar(exp.model, rows, particles["u-dsvgd"].shape[0])
    floor = _best_gaussian_kl(rows)
    assert finals["u-dsvgd"] <= bar and finals["svgd"] <= bar, (finals, bar)
    assert finals["u-dsvgd"] < floor, (finals, floor)
    shifted = exp.model.metrics(SamplePosterior(particles["u-dsvgd"] + 0.5), rows)[0]["kl"]
    assert shifted > bar, (shifted, bar)
