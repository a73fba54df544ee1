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
"""

import numpy as np
import pytest
from scipy import integrate, stats

from fedbayes_flwr.algorithms.pdmc import sampler
from fedbayes_flwr.inference.potentials import Potential
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
