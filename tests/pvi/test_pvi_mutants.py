"""PVI's server maths against closed forms computed here with numpy/scipy, not with the library.

Each test kills one mutant of issue 31 (the one-line bug it guards against is named in its
docstring) and, where cheap, runs the mutant itself through a monkeypatch and asserts that the
same check fails (``*_mutant_fails``), so the check's power is itself tested. The closed forms
are those of Bayesian linear regression with known noise ``sigma`` and a Gaussian prior
``N(m0, S0)``: posterior precision ``S0^-1 + X^T X / sigma^2``, evidence
``log N(y; X m0, X S0 X^T + sigma^2 I)``, and for any Gaussian ``q = N(m, S)`` the ELBO

    E_q[log p(y | theta)] - KL(q || p),
    E_q[log p(y | theta)] = -n/2 log(2 pi sigma^2) - (|y - X m|^2 + tr(X S X^T)) / (2 sigma^2).

Tolerances are float64 round-off of O(1e2)-sized sums (``1e-9`` relative) unless stated.
"""

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import multivariate_normal

from fedbayes_flwr.algorithms.pvi import server as pvi_server
from fedbayes_flwr.algorithms.pvi.messages import ServerState
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from tests.helpers import mutants

CONJUGATE = {"model": "linear-regression", "dataset": "synthetic", "num-clients": 10,
             "partition": "dirichlet", "partition-alpha": 0.3, "seed": 2, "synthetic-size": 300}


def _exp(**keys):
    return build_experiment(parse_run_config({**CONJUGATE, **keys}))


def _moments(nat):
    """``(m, S)`` of a full-covariance natural Gaussian (``eta2 = -Lambda / 2``), by hand."""
    precision = -2.0 * np.asarray(nat.eta2)
    cov = np.linalg.inv(precision)
    return cov @ nat.eta1, cov


def _prior(exp):
    return _moments(exp.prior)


def _elbo(exp, nat) -> float:
    x, y, sigma = exp.dataset.x_train, exp.dataset.y_train, exp.model.noise_scale
    (m, s), (m0, s0) = _moments(nat), _prior(exp)
    n, d = x.shape
    expected = (-0.5 * n * np.log(2 * np.pi * sigma**2)
                - (np.sum((y - x @ m) ** 2) + np.trace(x @ s @ x.T)) / (2 * sigma**2))
    p0 = np.linalg.inv(s0)
    kl = 0.5 * (np.trace(p0 @ s) + (m0 - m) @ p0 @ (m0 - m) - d
                + np.linalg.slogdet(s0)[1] - np.linalg.slogdet(s)[1])
    return float(expected - kl)


def _evidence(exp) -> float:
    x, y, sigma = exp.dataset.x_train, exp.dataset.y_train, exp.model.noise_scale
    m0, s0 = _prior(exp)
    return float(multivariate_normal(x @ m0, x @ s0 @ x.T + sigma**2 * np.eye(len(y))).logpdf(y))


def _exact_natural(exp, rows=None):
    """``(eta1, eta2)`` of the exact posterior (or of one client's likelihood, ``rows``)."""
    x, y, sigma = exp.dataset.x_train, exp.dataset.y_train, exp.model.noise_scale
    if rows is not None:
        return x[rows].T @ y[rows] / sigma**2, -0.5 * x[rows].T @ x[rows] / sigma**2
    return (exp.prior.eta1 + x.T @ y / sigma**2, exp.prior.eta2 - 0.5 * x.T @ x / sigma**2)


# --- M26: the client-held free energy (client.py free_energy_term) ---------------------------

def _free_energy_trace(exp):
    return [(state.posterior, log.log_marginal_likelihood) for _, state, log in iterate_in_process(exp)]


def _check_free_energy(exp):
    """F(q) = sum_k (E_q[log p(y_k)] - E_q[eta_k . T]) + A(q) - A(p0) is the ELBO of q whenever
    q = p0 prod t_k (Ashman et al. 2022, Section 2.2), and log p(y) at the exact posterior."""
    trace = _free_energy_trace(exp)
    for posterior, value in trace:
        assert value == pytest.approx(_elbo(exp, posterior), rel=1e-9), \
            f"client-held free energy {value} != ELBO of the round's q {_elbo(exp, posterior)}"
    return trace


def test_client_held_free_energy_is_the_exact_evidence():
    """Mutant M26: ``free_energy_term`` returns ``E_q[log p(y_k)]`` without ``- E_q[eta_k . T]``.

    Client-held factors (``guard = false``): damping 0.5 leaves q short of the posterior for three
    rounds (its free energy must be the ELBO of that q, not only at the optimum); a further run
    with damping 1 is exact after one round, where the free energy is the closed-form evidence.
    """
    _check_free_energy(_exp(**{"pvi.guard": False, "pvi.damping": 0.5, "num-rounds": 3}))
    exp = _exp(**{"pvi.guard": False, "pvi.damping": 1.0, "num-rounds": 1})
    (_, value), = _check_free_energy(exp)
    assert value == pytest.approx(_evidence(exp), rel=1e-9), \
        f"free energy at the exact posterior {value} != log evidence {_evidence(exp)}"


def test_client_held_free_energy_mutant_fails(monkeypatch):
    """The same check on mutant M26 (the dot term dropped) fails: it is off by
    ``sum_k E_q[eta_k . T]`` (hundreds of nats here)."""
    mutants.apply(monkeypatch, "M26")
    with pytest.raises(AssertionError, match="ELBO"):
        _check_free_energy(_exp(**{"pvi.guard": False, "pvi.damping": 1.0, "num-rounds": 1}))


# --- M03: server damping with client-held factors (server.py server_step) ---------------------

def _check_damped(exp, a, b, rounds):
    """Client damping ``a``, server damping ``b``, exact local solves (conjugate): each round
    every factor moves ``a b`` of the way to its likelihood, so after ``r`` rounds
    ``eta = eta0 + (1 - (1 - a b)^r) (eta_exact - eta0)`` exactly (Ashman et al. 2022, Section
    2.4: the damped update ``t_k <- t_k^(1 - rho) t_k'^rho``)."""
    exact1, exact2 = _exact_natural(exp)
    for r, state, _ in iterate_in_process(exp, num_rounds=rounds):
        frac = 1.0 - (1.0 - a * b) ** r
        want1 = exp.prior.eta1 + frac * (exact1 - exp.prior.eta1)
        want2 = exp.prior.eta2 + frac * (exact2 - exp.prior.eta2)
        np.testing.assert_allclose(state.posterior.eta1, want1, rtol=1e-9, atol=1e-9,
                                   err_msg=f"round {r}: eta1 is not the a*b-damped update")
        np.testing.assert_allclose(state.posterior.eta2, want2, rtol=1e-9, atol=1e-9,
                                   err_msg=f"round {r}: eta2 is not the a*b-damped update")


@pytest.mark.parametrize("a,b", [(0.5, 0.5), (1.0, 0.3)])
def test_client_held_server_damping_is_the_exact_damped_update(a, b):
    """Mutant M03: the client-held server adds the undamped delta (ignores ``server-damping``).
    ``guard = false`` keeps the factors on the clients (the server-held path is the guard's)."""
    exp = _exp(**{"pvi.guard": False, "pvi.damping": a, "pvi.server-damping": b, "num-rounds": 3})
    assert not exp.config.section.server_held
    _check_damped(exp, a, b, 3)


def test_client_held_server_damping_mutant_fails(monkeypatch):
    mutants.apply(monkeypatch, "M03")
    exp = _exp(**{"pvi.guard": False, "pvi.damping": 0.5, "pvi.server-damping": 0.5, "num-rounds": 2})
    with pytest.raises(AssertionError, match="damped update"):
        _check_damped(exp, 0.5, 0.5, 2)


# --- M25: the prior-scale EM step (server.py optimise_prior_scale) ----------------------------

SMALL = {"num-clients": 3, "partition": "iid", "synthetic-size": 15, "noise-scale": 3.0}


def _em_fixed_point(exp) -> float:
    """The EM fixed point ``s^2 = (|m(s)|^2 + tr S(s)) / d`` with ``(m(s), S(s))`` the exact
    posterior under ``N(0, s^2 I)`` (Ashman et al. 2022, Appendix A; Bishop 2006, eq. 9.63 with
    alpha = 1 / s^2), solved with brentq; it is also a stationary point of the evidence."""
    x, y, s2 = exp.dataset.x_train, exp.dataset.y_train, exp.model.noise_scale**2
    d = x.shape[1]

    def residual(s):
        cov = np.linalg.inv(np.eye(d) / s**2 + x.T @ x / s2)
        m = cov @ x.T @ y / s2
        return s**2 - (m @ m + np.trace(cov)) / d

    return float(brentq(residual, 1e-2, 1e2, xtol=1e-14))


def test_prior_scale_em_is_the_closed_form_fixed_point():
    """Mutant M25: the EM step uses ``|m|^2 / d`` without ``tr(S)``. With 12 rows, noise 3 and
    d = 3, ``tr(S) = 1.4`` against ``|m|^2 = 2.4`` (at s = 1), so the two fixed points differ (the
    mutant's collapses to ``s -> 0``). EM is monotone here and converges linearly (measured: the
    error contracts by about 0.53 a round, 4e-12 after 40 rounds), so every round must come
    closer to the fixed point and the last agree with it to ``rel = 1e-8``. The fixed point is
    also the maximiser of the closed-form evidence (bounded search, ``xatol`` 1e-10 in log s)."""
    _check_prior_scale()


def _check_prior_scale():
    exp = _exp(**SMALL, **{"pvi.optimise-prior": True, "pvi.damping": 1.0, "pvi.guard": False,
                           "num-rounds": 40})
    x, y, s2 = exp.dataset.x_train, exp.dataset.y_train, exp.model.noise_scale**2
    cov = np.linalg.inv(np.eye(x.shape[1]) + x.T @ x / s2)  # tr(S) matters here (at s = 1)
    assert np.trace(cov) > 0.3 * np.sum((cov @ x.T @ y / s2) ** 2)
    best = _em_fixed_point(exp)

    def neg_evidence(log_scale):
        return -multivariate_normal(np.zeros(len(y)), np.exp(2 * log_scale) * x @ x.T
                                    + s2 * np.eye(len(y))).logpdf(y)

    search = minimize_scalar(neg_evidence, bounds=(-3, 3), method="bounded",
                             options={"xatol": 1e-10})
    assert np.exp(search.x) == pytest.approx(best, rel=1e-6)  # the derivation, checked twice
    error = 1.0  # |s_0 - s*| / s* with s_0 = 1 is 0.28
    for r, _, log in iterate_in_process(exp):
        now = abs(log.prior_scale / best - 1.0)
        assert now <= error + 1e-12, \
            f"round {r}: prior scale {log.prior_scale} moved away from the EM fixed point {best}"
        error = now
    assert log.prior_scale == pytest.approx(best, rel=1e-8), \
        f"learned prior scale {log.prior_scale} != EM fixed point {best}"


def test_prior_scale_em_mutant_fails(monkeypatch):
    mutants.apply(monkeypatch, "M25")
    with pytest.raises(AssertionError, match="EM fixed point"):
        _check_prior_scale()


def test_prior_scale_em_step_is_the_second_moment():
    """One EM step from a given q: ``s^2 = E_q[theta^T theta] / d = (|m|^2 + tr S) / d`` and the
    posterior's prior replaced (``q_new = q / p_old x p_new``), checked on a q with ``tr S``
    comparable to ``|m|^2``."""
    exp = _exp(**SMALL, **{"pvi.guard": False, "pvi.damping": 1.0, "num-rounds": 1})
    state = list(iterate_in_process(exp))[-1][1]
    m, cov = _moments(state.posterior)
    new, scale = pvi_server.optimise_prior_scale(state)
    assert scale**2 == pytest.approx((m @ m + np.trace(cov)) / len(m), rel=1e-12)
    d = len(m)
    np.testing.assert_allclose(new.prior.eta2, -0.5 * np.eye(d) / scale**2, rtol=1e-12)
    np.testing.assert_allclose(new.posterior.eta2 - new.prior.eta2,
                               state.posterior.eta2 - state.prior.eta2, rtol=1e-12, atol=1e-12)


# --- M04: the asynchronous staleness step (server.py staleness_step) --------------------------

def test_async_staleness_step_is_one_over_sqrt_one_plus_tau():
    """Mutant M04: ``tau`` off by one. ``tau`` is reconstructed from the log alone: a client's
    reply applied at update ``j`` was computed against the posterior after update ``prev`` (its
    previous application, or 0 for the first request), so ``tau = j - 1 - prev`` and the step is
    ``1 / sqrt(1 + tau)`` (Zhang et al. 2016). The conjugate factors then follow exactly:
    ``t_k <- (1 - s) t_k + s l_k`` with ``l_k = (X_k^T y_k, -X_k^T X_k / 2) / sigma^2``
    (exact local solves make ``q_new / q_cav = l_k``), and ``q = p0 prod_k t_k``."""
    _check_staleness()


def test_async_staleness_step_mutant_fails(monkeypatch):
    mutants.apply(monkeypatch, "M04")
    with pytest.raises(AssertionError, match="step"):
        _check_staleness()


def _check_staleness():
    exp = _exp(**{"num-clients": 4, "pvi.schedule": "asynchronous", "pvi.damping": "auto",
                  "num-rounds": 24, "stragglers": "3"})
    previous = dict.fromkeys(range(exp.num_clients), 0)
    factors = {k: (np.zeros_like(exp.prior.eta1), np.zeros_like(exp.prior.eta2))
               for k in range(exp.num_clients)}
    taus = []
    for j, state, log in iterate_in_process(exp):
        (k,) = log.clients
        tau = j - 1 - previous[k]
        previous[k] = j
        taus.append(tau)
        step = 1.0 / np.sqrt(1.0 + tau)
        assert log.diagnostics["pvi_step"] == pytest.approx(step, rel=1e-12), \
            f"update {j} (client {k}, tau {tau}): step {log.diagnostics['pvi_step']} != {step}"
        l1, l2 = _exact_natural(exp, exp.partitions[k])
        factors[k] = ((1 - step) * factors[k][0] + step * l1, (1 - step) * factors[k][1] + step * l2)
        np.testing.assert_allclose(state.posterior.eta1,
                                   exp.prior.eta1 + sum(f[0] for f in factors.values()), rtol=1e-9)
    assert previous[3] > 0  # the straggler's reply arrived
    assert max(taus) >= 10 and {0, 1, 2} <= set(taus)  # fresh, stale and the straggler's tau


@pytest.mark.parametrize("server_round,request_round,tau", [(0, 1, 0), (1, 1, 1), (1, 2, 0),
                                                             (7, 3, 5), (3, 9, 0)])
def test_staleness_step_formula(server_round, request_round, tau):
    """``request_round`` is the update a request was made for (server round + 1 then): the reply
    is ``tau = server_round - (request_round - 1)`` updates stale (never negative)."""
    state = ServerState(prior=None, posterior=None, server_round=server_round, accepted_round=None)
    assert pvi_server.staleness_step(state, request_round) == pytest.approx(1 / np.sqrt(1 + tau),
                                                                            rel=1e-15)


# --- client.py mutants of the fresh sweep (seed 0, population 1,513) ---------------------------

def test_streaming_vb_without_deletion_adds_the_likelihood_every_visit():
    """``cavity = no-deletion`` (streaming VB, Ashman et al. 2022 Section 5): the cavity is the
    current ``q``, so with a conjugate model every visit's delta is ``q_new - q``, the client's
    likelihood ``(X^T y / sigma^2, -X^T X / (2 sigma^2))`` computed here, on the first visit
    AND the second (when ``t_k`` already holds one copy). Mutant ``== "no-deletion"`` ->
    ``< "no-deletion"`` takes the deletion branch, whose second delta is
    ``q_new - q - t_k = 0``."""
    from dataclasses import replace

    from fedbayes_flwr.algorithms.pvi import client as pvi_client
    from fedbayes_flwr.algorithms.pvi.messages import ServerMessage
    from fedbayes_flwr.inference.gaussian import NaturalGaussian

    exp = _exp()
    config = replace(exp.config.section, cavity="no-deletion", damping=1.0)
    data = exp.client_data(0)
    x, y, sigma = data.x, data.y, exp.model.noise_scale
    like = (x.T @ y / sigma**2, -0.5 * x.T @ x / sigma**2)
    state = pvi_client.init_client(exp.prior)
    q = exp.prior
    for visit in (1, 2):
        state, reply = pvi_client.client_step([0, visit], state, ServerMessage(q, visit, visit - 1),
                                              exp.model, x, y, config)
        np.testing.assert_allclose(reply.delta.eta1, like[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(reply.delta.eta2, like[1], rtol=1e-9, atol=1e-9)
        q = NaturalGaussian(q.eta1 + reply.delta.eta1, q.eta2 + reply.delta.eta2)


def test_dp_client_sees_its_own_row_count(monkeypatch):
    """The DP-SGD client's sampling rate is ``batch-size / n_k`` with ``n_k`` its ROWS (40 rows,
    3 features, batch 10: q = 0.25), and a batch larger than its rows (50) is refused naming
    the 40 rows. Mutants: ``n = x.shape[-1]`` (the feature count, 3: batch 10 refused) and
    ``batch-size > n`` -> ``<=`` (batch 10 refused)."""
    from fedbayes_flwr.algorithms.pvi import client as pvi_client
    from fedbayes_flwr.algorithms.pvi.config import PVIConfig
    from fedbayes_flwr.inference import vi

    seen = {}

    def fake_fit(seed, model, x, y, cavity, init, vi_config, dp):
        seen["dp"] = dp
        return cavity

    class Model:
        def local_init(self, init, d):
            return init

    monkeypatch.setattr(vi, "fit_gaussian_dp_sgd", fake_fit)
    prior = _exp().prior
    x, y = np.zeros((40, 3)), np.zeros(40)
    config = PVIConfig(dp="dp-sgd", dp_noise_multiplier=1.5, batch_size=10)
    pvi_client.private_optimum([0, 1], Model(), x, y, prior, prior, config, 4)
    assert seen["dp"].sampling_rate == 0.25 and seen["dp"].noise_multiplier == 1.5
    with pytest.raises(ValueError, match="larger than this partition's 40 rows"):
        pvi_client.private_optimum([0, 1], Model(), x, y, prior, prior,
                                   PVIConfig(dp="dp-sgd", dp_noise_multiplier=1.5, batch_size=50), 4)
