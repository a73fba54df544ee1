"""Zig-Zag thinning on a potential where it matters (issue 31, mutant M11: the slope bound halved,
an invalid bound that the quadratic tests cannot see, since there every candidate is accepted).

``U(x) = sum_i log cosh(x_i)`` has ``dU_i = tanh(x_i)`` and ``|d2U_ii| = sech^2 <= 1`` (the bound,
``hess_abs = I``, is tight at 0). From ``x = (0, -1)`` with ``v = (1, 1)`` the coordinate rates
along the path are ``tanh(t)`` and ``tanh(t - 1)^+``, so the first event time has the exact law

    P(T > t) = exp(-Lambda(t)),  Lambda(t) = log cosh t + [t > 1] log cosh(t - 1),

and the flipped coordinate is 2 with probability ``int lambda_2(t) P(T > t) dt`` (Bierkens,
Fearnhead & Roberts 2019, Section 3: Poisson thinning is exact for any valid bound). A bound
below the rate (the mutant's ``s / 2`` against ``tanh s ~ s``) accepts every candidate early
and delays the events. Measured (K = 20000, seed 0): the exact bound gives KS D = 0.009
(p = 0.06), mean 1.339 against the exact 1.348; the halved bound D = 0.197 (p = 0), mean 1.711;
a bound 0.8x too small still fails (D = 0.023, p = 2e-9), 0.95x passes (D = 0.006).

At the end, exact checks of the driver's bookkeeping (issue 31's survivors in ``driver.py``): the
default refreshment, ``grad_evals`` against a count at the potentials, and the Metropolis
trajectory length rounded up to the rate grid.
"""

import numpy as np
import pytest
from scipy import integrate, stats

from fedbayes_flwr.algorithms.pdmc import sampler
from fedbayes_flwr.algorithms.pdmc.driver import simulate
from fedbayes_flwr.inference.potentials import Potential, Quadratic
from tests.helpers import mutants

K = 20_000  # chains, one event each: one vectorised propose() call


class LogCosh(Potential):
    dim = 2
    quadratic = False
    hess_abs = np.eye(2)
    hess_bound = np.eye(2)

    def grad(self, x):
        return np.tanh(x)

    def value(self, x):
        return np.sum(np.log(np.cosh(x)), axis=1)


def _log_cosh(t):
    t = np.abs(t)
    return t + np.log1p(np.exp(-2 * t)) - np.log(2.0)


def _cumulative_rate(t):
    t = np.asarray(t, dtype=np.float64)
    return _log_cosh(t) + np.where(t > 1, _log_cosh(np.maximum(t - 1, 0.0)), 0.0)


def _cdf(t):
    return 1.0 - np.exp(-_cumulative_rate(t))


def _exact_moments():
    survival = lambda t: np.exp(-_cumulative_rate(t))  # noqa: E731
    end = 80.0  # P(T > 80) < 4 exp(-158): nothing beyond

    def quad(f):
        return integrate.quad(f, 0, 1)[0] + integrate.quad(f, 1, end)[0]

    mean = quad(survival)
    second = 2 * quad(lambda t: t * survival(t))
    flip2 = quad(lambda t: max(np.tanh(t - 1), 0.0) * survival(t))
    return mean, second - mean**2, flip2


def _check_event_law(seed=0):
    x = np.tile([0.0, -1.0], (K, 1))
    v = np.ones((K, 2))
    out = sampler.propose(LogCosh(), "zigzag", x, v, np.full(K, np.inf), np.random.default_rng(seed))
    tau = out.tau
    assert np.all(np.isfinite(tau))
    # KS against the exact law; p > 1e-4 (a fixed seed: a false alarm has probability 1e-4)
    ks = stats.kstest(tau, _cdf)
    assert ks.pvalue > 1e-4, f"event times do not follow the exact law: KS D = {ks.statistic:.4f}, " \
                             f"p = {ks.pvalue:.2e}, median {np.median(tau):.3f}"
    # mean event time within 5 Monte-Carlo standard errors (sd / sqrt(K), K independent chains)
    mean, var, flip2 = _exact_moments()
    mcse = np.sqrt(var / K)
    assert abs(tau.mean() - mean) < 5 * mcse, \
        f"mean event time {tau.mean():.4f} vs exact {mean:.4f} (5 MCSE = {5 * mcse:.4f})"
    # which coordinate flipped: binomial, 5 standard errors
    second = np.mean(out.velocity[:, 1] < 0)
    assert np.all((out.velocity < 0).sum(axis=1) == 1)  # exactly one coordinate flips
    se = np.sqrt(flip2 * (1 - flip2) / K)
    assert abs(second - flip2) < 5 * se, f"P(flip coordinate 2) {second:.4f} vs {flip2:.4f}"


@pytest.mark.parametrize("seed", [0, 1])
def test_zigzag_thinning_gives_the_exact_event_law(seed):
    _check_event_law(seed)


def test_zigzag_thinning_mutant_fails(monkeypatch):
    """Mutant M11 (slope bound halved): the same check fails (measured KS D = 0.197)."""
    mutants.apply(monkeypatch, "M11")
    with pytest.raises(AssertionError, match="exact law|exact"):
        _check_event_law(0)


# ---------------------------------------------- the same check with a preconditioner (issue 33)
class ConvexLogCosh(LogCosh):
    convex = True  # sech^2 in (0, 1]: 0 < H <= B = I, so the Cauchy-Schwarz bound applies too


# x = m + L z with L a rotation by 30 degrees scaled by 2 (and a shear): every bound in z is
# about 4x the untransformed one, so forgetting the transform halves it at least
L_TEST = 2.0 * np.array([[np.cos(0.5), -np.sin(0.5)], [np.sin(0.5), np.cos(0.5)]]) @ \
    np.array([[1.0, 0.4], [0.0, 1.0]])
M_TEST = np.array([0.3, -0.2])
Z0, W0 = np.array([0.0, -0.5]), np.array([1.0, 1.0])


def _z_law():
    """Exact first-event law along ``z0 + w t`` in z: coordinate rates
    ``(w_i (L^T tanh(m + L (z0 + w t)))_i)^+``, by quadrature on a fine grid (the rates are
    smooth; 400,001 points on [0, 40], where P(T > 40) < 1e-30)."""
    t = np.linspace(0.0, 40.0, 400_001)
    x = M_TEST + (Z0 + np.outer(t, W0)) @ L_TEST.T
    rates = np.maximum(0.0, W0 * (np.tanh(x) @ L_TEST))  # (T, 2)
    cum = integrate.cumulative_trapezoid(rates.sum(1), t, initial=0.0)
    surv = np.exp(-cum)
    flip = integrate.trapezoid(rates * surv[:, None], t, axis=0)
    return t, cum, flip


def _check_z_event_law(pot, seed=0):
    t, cum, flip = _z_law()
    z = np.tile(Z0, (K, 1))
    v = np.tile(W0, (K, 1))
    out = sampler.propose(pot, "zigzag", z, v, np.full(K, np.inf), np.random.default_rng(seed))
    assert np.all(np.isfinite(out.tau))
    ks = stats.kstest(out.tau, lambda s: 1.0 - np.exp(-np.interp(s, t, cum)))
    assert ks.pvalue > 1e-4, f"event times do not follow the exact law: KS D = {ks.statistic:.4f}, " \
                             f"p = {ks.pvalue:.2e}"
    second = np.mean(out.velocity[:, 1] < 0)  # binomial, 5 standard errors
    p2 = flip[1] / flip.sum()
    assert abs(second - p2) < 5 * np.sqrt(p2 * (1 - p2) / K), (second, p2)


@pytest.mark.parametrize("convex", [False, True])
def test_preconditioned_thinning_gives_the_exact_event_law(convex):
    """With x = m + L z the transformed bounds (|L|^T C |L| row sums, and for a convex U the
    Cauchy-Schwarz bound from L^T B L) keep Poisson thinning exact in z."""
    from fedbayes_flwr.inference.potentials import Preconditioned

    pot = Preconditioned(ConvexLogCosh() if convex else LogCosh(), M_TEST, L_TEST)
    assert pot.cauchy_schwarz == convex
    _check_z_event_law(pot)


def test_preconditioned_untransformed_bound_mutant_fails():
    """The natural bug: the bounds kept in x (C, B) while the rates are in z. They are about 4x
    too small here, and the thinning check (the event law) catches it."""
    from fedbayes_flwr.inference.potentials import Preconditioned

    pot = Preconditioned(ConvexLogCosh(), M_TEST, L_TEST)
    pot.hess_abs, pot.hess_bound = LogCosh.hess_abs, LogCosh.hess_bound
    with pytest.raises(AssertionError, match="exact law"):
        _check_z_event_law(pot)


def test_zigzag_thinning_mutant_fails_with_a_preconditioner(monkeypatch):
    """Mutant M11 (the row-sum slope bound halved) is still caught in z."""
    from fedbayes_flwr.inference.potentials import Preconditioned

    mutants.apply(monkeypatch, "M11")
    with pytest.raises(AssertionError, match="exact law"):
        _check_z_event_law(Preconditioned(LogCosh(), M_TEST, L_TEST))


# ------------------------------------- the driver's bookkeeping (issue 31: driver.py survivors)
# Exact checks, no statistics: the default refreshment, the gradient-evaluation count against an
# independent count of the potentials' calls, and the Metropolis trajectory length (rounded up to
# a multiple of the rate grid) against its closed form on a flat target.


class Counted:
    """A potential that counts its evaluations, one per row (one chain) of each ``grad`` and
    ``value`` call; every other attribute is the wrapped potential's."""

    def __init__(self, inner):
        self.inner, self.grads, self.values = inner, 0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def grad(self, x):
        self.grads += x.shape[0]
        return self.inner.grad(x)

    def value(self, x):
        self.values += x.shape[0]
        return self.inner.value(x)


def _two_workers():
    """A thinned non-quadratic worker (log cosh: candidates get rejected) and a quadratic one."""
    return [Counted(LogCosh()), Counted(Quadratic(0.5 * np.eye(2), np.array([0.3, -0.2])))]


def _start(k, sampler_name, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, 2)), sampler.initial_velocity(sampler_name, rng, k, 2)


def test_default_refresh_is_none():
    """``simulate``'s documented default is ``refresh = 0`` (no refreshment): a run without the
    argument is bitwise the run with ``refresh=0.0``; power: ``refresh=1.0`` (BPS refreshment at
    rate 1 over process time 10: ~10 refreshments per chain) changes the run."""
    pots, prior = _two_workers(), Quadratic(0.25 * np.eye(2), np.zeros(2))
    x0, v0 = _start(3, "bps")

    def run(**kw):
        return simulate(pots, prior, "bps", x0, v0, process_time=10.0, delta=0.5, seed=4, **kw)

    default, none, some = run(), run(refresh=0.0), run(refresh=1.0)
    for a, b in zip(default, none, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(default.chains, some.chains)
    assert not np.array_equal(default.events, some.events)


@pytest.mark.parametrize("sampler_name", ["zigzag", "bps"])
@pytest.mark.parametrize("bounds", ["exact", "metropolis"])
def test_grad_evals_is_the_number_of_potential_evaluations(sampler_name, bounds):
    """``Run.grad_evals`` is the work spent: every gradient of every chain at the server's prior
    and at each worker (thinning: rejected candidates included; grid rates: every cell end and
    the Metropolis path terms), plus, with ``metropolis``, each worker's two values
    ``U_m(x_0)``, ``U_m(x_T)`` per chain per trajectory (the bundle's ``evals + 2 k``). Counted
    here at the potentials themselves. ``K = 3`` chains (``2 k`` and ``2 ** k`` differ) and a
    moving prior, so both the server's and the workers' shares are positive."""
    pots = _two_workers()
    prior = Counted(Quadratic(0.25 * np.eye(2), np.zeros(2)))
    x0, v0 = _start(3, sampler_name, seed=1)
    run = simulate(pots, prior, sampler_name, x0, v0, process_time=6.0, delta=0.5, seed=2,
                   bounds=bounds, trajectory=1.0, rate_grid=0.5)
    assert prior.grads > 0 and all(p.grads > 0 for p in pots)
    assert prior.values == 0  # the prior's share of log alpha cancels: never evaluated
    if bounds == "exact":
        assert all(p.values == 0 for p in pots)
    else:  # two values per chain per worker per trajectory: 6 trajectories of length 1, K = 3
        assert all(p.values == 2 * 3 * 6 for p in pots)
    expected = prior.grads + sum(p.grads + p.values for p in pots)
    assert run.grad_evals == expected, (run.grad_evals, expected)


@pytest.mark.parametrize("sampler_name", ["zigzag", "bps"])
@pytest.mark.parametrize("process_time, burn_in, count, first", [
    (2.2, 0.0, 3, 1), (3.0, 0.0, 3, 1), (3.0, 1.5, 3, 2), (3.0, 2.0, 3, 2)])
def test_metropolis_trajectory_is_rounded_up_to_the_grid(sampler_name, process_time, burn_in,
                                                         count, first):
    """``trajectory = 0.7`` on ``rate_grid = 0.5`` is rounded up to ``T = 1.0`` (the documented
    rounding: the reversal argument needs ``T`` a multiple of the grid). On a flat target (zero
    potentials) there are no events and ``log alpha = 0``, so every step accepts and after step
    ``j`` the chain is exactly ``x_0 + j T v``: ``ceil(process_time / T)`` steps, the samples
    those with ``j T >= burn_in``, and per step ``T / max_horizon`` = 1 exchange of the
    trajectory plus the Metropolis exchange. (Rounding down, ``T = 0.5``, gives twice the steps
    at half the spacing.)"""
    flat = Quadratic(np.zeros((2, 2)), np.zeros(2))
    pots = [Counted(flat), Counted(flat)]
    x0, v0 = _start(3, sampler_name, seed=5)
    run = simulate(pots, flat, sampler_name, x0, v0, process_time=process_time, delta=0.1,
                   seed=1, burn_in=burn_in, bounds="metropolis", trajectory=0.7, rate_grid=0.5,
                   max_horizon=1.0)
    length = 1.0
    steps = np.arange(first, count + 1)
    expected = x0[:, None, :] + steps[None, :, None] * length * v0[:, None, :]
    assert run.chains.shape == (3, steps.size, 2)
    np.testing.assert_allclose(run.chains, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(run.x, x0 + count * length * v0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(run.v, v0)  # accepted: the velocity kept
    assert run.exchanges == 2 * count
    assert run.acceptance == 1.0
    assert np.all(run.events == 0)
    # each worker's end terms: two values per chain per Metropolis step
    assert all(p.values == 2 * 3 * count for p in pots)


@pytest.mark.parametrize("bounds", ["exact", "metropolis"])
def test_each_party_draws_from_its_documented_stream(bounds, monkeypatch):
    """``simulate``'s documented streams: in exchange ``e`` party ``m`` (the server 0, worker
    ``m`` 1-based) draws from ``default_rng([seed, e, m])``, every party once per proposal
    exchange (distinct streams: shared ones would make the proposals dependent, sampler.py), and
    the Metropolis exchange only the server, for its acceptance uniforms. Recorded at numpy."""
    keys = []
    real = np.random.default_rng

    def recording(seed=None):
        keys.append(tuple(seed))
        return real(seed)

    pots, prior = _two_workers(), Quadratic(0.25 * np.eye(2), np.zeros(2))
    x0, v0 = _start(3, "zigzag", seed=1)
    monkeypatch.setattr(np.random, "default_rng", recording)
    run = simulate(pots, prior, "zigzag", x0, v0, process_time=3.0, delta=0.5, seed=7,
                   bounds=bounds, trajectory=1.0, rate_grid=0.5)
    monkeypatch.undo()
    assert len(set(keys)) == len(keys)  # no stream drawn twice
    assert {k[0] for k in keys} == {7}
    per = {e: sorted(k[2] for k in keys if k[1] == e) for e in range(1, run.exchanges + 1)}
    assert sorted({k[1] for k in keys}) == list(per)
    # a Metropolis exchange ends each of the 3 trajectories; every other exchange asks all
    proposals = [e for e, m in per.items() if m == [0, 1, 2]]
    metropolis = [e for e, m in per.items() if m == [0]]
    assert len(proposals) + len(metropolis) == run.exchanges
    assert len(metropolis) == (3 if bounds == "metropolis" else 0)


class ValueOnly(Potential):
    """A stub, not a consistent potential: zero gradient (no events, zero path terms) but
    ``value = 50 |x|^2``, which only the Metropolis step reads; from ``x_0 = 0`` every
    trajectory ends at ``|x_T|^2 = d T^2 = 2`` (Zig-Zag), so ``log alpha = -100`` and the step
    rejects (``P(log u >= -100) = e^-100``)."""

    dim = 2

    def grad(self, x):
        return np.zeros_like(x)

    def value(self, x):
        return 50.0 * np.sum(x * x, axis=1)


def test_a_rejected_metropolis_step_restarts_from_the_start_with_the_velocity_flipped():
    """metropolis.py: "on rejection from ``(x_0, -v_0)``". Every step rejects (ValueOnly), so
    every sample is ``x_0`` and after 3 steps the velocity is ``(-1)^3 v_0``; acceptance 0."""
    x0 = np.zeros((3, 2))
    v0 = sampler.initial_velocity("zigzag", np.random.default_rng(2), 3, 2)
    flat = Quadratic(np.zeros((2, 2)), np.zeros(2))
    run = simulate([ValueOnly()], flat, "zigzag", x0, v0, process_time=3.0, delta=0.5, seed=3,
                   bounds="metropolis", trajectory=1.0, rate_grid=0.5)
    assert run.chains.shape == (3, 3, 2)
    np.testing.assert_array_equal(run.chains, 0.0)
    np.testing.assert_array_equal(run.x, x0)
    np.testing.assert_array_equal(run.v, -v0)
    assert run.acceptance == 0.0


def test_shifted_zigzag_rate_bound_starts_at_the_positive_part_plus_the_shift(monkeypatch):
    # With a refreshment shift rho the Zig-Zag rate is (v_i d_i U)^+ + rho, so the thinning
    # bound's intercept at the current point is max(v_i d_i U(x), 0) + rho (the seed paper,
    # Theorem 5.1): for U = |x|^2 / 2 at x = (-0.5, 2), v = (1, 1): v * grad = (-0.5, 2) ->
    # (0 + rho, 2 + rho). (Mutant: max(., -1), an intercept below the true rate rho.)
    seen = []
    real = sampler.first_arrival

    def spy(a, b, e):
        seen.append(np.array(a, dtype=np.float64))
        return real(a, b, e)

    monkeypatch.setattr(sampler, "first_arrival", spy)
    from fedbayes_flwr.inference import potentials as P

    pot = P.gaussian_prior_potential(2, 1.0)
    x, v = np.array([[-0.5, 2.0]]), np.array([[1.0, 1.0]])
    sampler.propose(pot, "zigzag", x, v, np.array([10.0]), np.random.default_rng(0), rate_shift=0.3)
    np.testing.assert_allclose(seen[0], [[0.3, 2.3]], rtol=1e-15)


def test_segment_moments_are_the_integrals_of_the_linear_path():
    # int_0^tau (x0 + v s) ds and int_0^tau (x0 + v s)^2 ds per coordinate, by scipy quad
    # (mutants of the closed form's t**2 / t**3 terms)
    x0 = np.array([[0.5, -1.0], [2.0, 0.0]])
    v = np.array([[1.0, -1.0], [-1.0, 1.0]])
    tau = np.array([0.7, 2.3])
    first, second = sampler.segment_moments(x0, v, tau)
    for c in range(2):
        for i in range(2):
            a, b = x0[c, i], v[c, i]
            f1 = integrate.quad(lambda s, a=a, b=b: a + b * s, 0.0, tau[c])[0]
            f2 = integrate.quad(lambda s, a=a, b=b: (a + b * s) ** 2, 0.0, tau[c])[0]
            assert np.isclose(first[c, i], f1, rtol=1e-12, atol=1e-14)
            assert np.isclose(second[c, i], f2, rtol=1e-12, atol=1e-14)


def test_combine_treats_a_time_beyond_the_horizon_as_no_event():
    # combine's contract: no event within max_horizon -> tau = max_horizon and winner -1.
    # Chain 0: the server proposes 2.5 and the worker inf (horizon 1.0): no event; chain 1:
    # the worker's 0.4 wins. (Mutant `tau > max_horizon` -> `tau is max_horizon`.)
    own = sampler.Proposal(np.array([2.5, 0.9]), np.array([[1.0], [1.0]]), 0)
    worker = sampler.Proposal(np.array([np.inf, 0.4]), np.array([[-1.0], [-1.0]]), 0)
    tau, _, winner = sampler.combine(own, [worker], 1.0)
    np.testing.assert_array_equal(tau, [1.0, 0.4])
    np.testing.assert_array_equal(winner, [-1, 1])
