"""The agreed mass matrix of decentralized MH-HMC (``dhmc.mass-matrix``, issue 33).

Target: Bayesian linear regression with strongly correlated features (equicorrelation 0.9),
so the posterior is a correlated Gaussian known exactly. Tolerances from the maths: moments
within 4 Monte Carlo standard errors from the ESS of independent chains (the agents' average
per chain, never across agents), as ``test_dhmc.py``; the adapted variances within 4 standard
errors of a variance estimate from the window's draws (``sqrt(2 / ESS)`` relative, the ESS of
those draws measured) plus Stan's regularisation shift; identities (the momentum's covariance,
the involution, unit mass) to rounding or bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.algorithms.dhmc import agents as H
from fedbayes_flwr.algorithms.dhmc import mass as MM
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

RHO, N, D, AGENTS = 0.9, 250, 3, 5


# ------------------------------------------------------------------ windows and estimate
def test_windows_are_stans():
    """Stan's defaults (buffers 75 / 50, first window 25, doubling, the last stretched to the
    terminal buffer) and its small-warm-up rule (15% / 10%), none below 20 iterations."""
    assert MM.windows(1000) == ((75, 100), (100, 150), (150, 250), (250, 450), (450, 950))
    assert MM.windows(200) == ((75, 100), (100, 150))
    assert MM.windows(100) == ((15, 90),)
    assert MM.windows(19) == ()


def test_estimate_is_stans_regularised_covariance():
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((40, 4)) @ rng.standard_normal((4, 4))
    for kind in ("diagonal", "dense"):
        stats = np.zeros(MM.num_stats(kind, 4))
        for chunk in np.split(draws, 5):  # five iterations of 8 chains
            stats = MM.add(stats, chunk, kind)
        n = 40
        cov = np.cov(draws.T)
        want = (n / (n + 5)) * cov + 1e-3 * (5 / (n + 5)) * np.eye(4)
        got = MM.estimate(stats, kind, 4)
        np.testing.assert_allclose(got, np.diag(want) if kind == "diagonal" else want,
                                   rtol=1e-10)


def test_auto_rule():
    """``auto``: dense for small d with enough draws, diagonal above 200 dimensions or with
    fewer than 10 d draws in the last window, none without windows, with local decisions or
    without step size adaptation."""
    assert MM.resolve("auto", 11, 200, 16) == "dense"
    assert MM.resolve("auto", 650, 200, 16) == "diagonal"
    assert MM.resolve("auto", 100, 200, 4) == "diagonal"  # 4 x 50 draws < 10 x 100
    assert MM.resolve("auto", 11, 10, 16) == "none"
    assert MM.resolve("auto", 11, 200, 16, "local") == "none"
    assert MM.resolve("auto", 11, 200, 16, adapt=False) == "none"
    assert MM.resolve("diagonal", 11, 10, 16) == "diagonal"


def test_momentum_kinetic_and_velocity_use_the_same_matrix():
    """``p = C^{-T} xi`` has ``p^T M^{-1} p = |xi|^2`` (so ``p ~ N(0, M)`` when ``xi`` is
    standard normal) and ``M^{-1} p`` is the velocity, for both layouts."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 3))
    inv = a @ a.T + 0.1 * np.eye(3)
    xi = rng.standard_normal((7, 3))
    for inv_mass in (inv, np.diag(inv).copy()):
        p = H.momentum(xi, MM.factor(inv_mass))
        np.testing.assert_allclose(2 * H.kinetic(p, inv_mass), np.sum(xi**2, axis=1),
                                   rtol=1e-10)
        full = inv_mass if inv_mass.ndim == 2 else np.diag(inv_mass)
        np.testing.assert_allclose(H.velocity(p, inv_mass), p @ full, rtol=1e-12)


def _pooled(seed=0):
    rng = np.random.default_rng(seed)
    cov = RHO * np.ones((D, D)) + (1 - RHO) * np.eye(D)
    x = rng.multivariate_normal(np.zeros(D), cov, size=N)
    y = x @ rng.standard_normal(D) + rng.standard_normal(N)
    return x, y


def test_leapfrog_with_a_mass_matrix_is_reversible():
    """One agent (no gossip): the step ``(w, p) -> (z, p')`` with a dense ``M`` followed by a
    momentum flip is an involution (back to ``(w, -p)`` to rounding) and its energy change is
    the exact ``U(z) - U(w) + K(p') - K(p)`` with ``K(p) = p^T M^{-1} p / 2`` (exact energy):
    the Metropolis test then is HMC's with that ``M``."""
    x, y = _pooled()
    pot = H.LocalPotential(P.linear_regression_potential(x, y, 1.0),
                           P.gaussian_prior_potential(D, 1.0), 1)
    inv = np.linalg.inv(x.T @ x + np.eye(D))  # a non-identity M^{-1}: the posterior covariance
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, D)) * 0.1
    p = H.momentum(rng.standard_normal((5, D)), MM.factor(inv))

    def step(w, p):
        st = H.init_agent(pot, w)
        st, z, a = H.begin(st, pot, p, 0.3, 1, energy="exact", inv_mass=inv)
        st, b = H.track(st, pot, z)
        out = H.decide(st, a, b, np.zeros(len(w)), 0.3, 1, inv_mass=inv)
        p_new = st.p_half - 0.15 * b
        return z, p_new, out.delta_h

    z, p_new, dh = step(w, p)
    back, p_back, dh_back = step(z, -p_new)
    np.testing.assert_allclose(back, w, atol=1e-12)
    np.testing.assert_allclose(p_back, -p, atol=1e-10)
    exact = pot.value(z) - pot.value(w) + H.kinetic(p_new, inv) - H.kinetic(p, inv)
    np.testing.assert_allclose(dh, exact, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(dh_back, -dh, rtol=1e-9, atol=1e-10)


def test_identity_mass_is_bitwise_unit_mass():
    """The mass code path with ``M = I`` makes bitwise the moves of unit mass (``none``, the
    path every run without a mass matrix takes, unchanged from before the option existed)."""
    x, y = _pooled()
    pots = [H.LocalPotential(P.linear_regression_potential(x[i], y[i], 1.0),
                             P.gaussian_prior_potential(D, 1.0), 2)
            for i in np.array_split(np.arange(N), 2)]
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((4, D)) * 0.1
    xi = rng.standard_normal((4, D))
    for inv in (np.ones(D), np.eye(D)):
        unit = [H.begin(H.init_agent(pot, w0), pot, xi, 0.05, 2, energy="exact")
                for pot in pots]
        mass = [H.begin(H.init_agent(pot, w0), pot, H.momentum(xi, MM.factor(inv)), 0.05, 2,
                        energy="exact", inv_mass=inv) for pot in pots]
        for (s0, z0, a0), (s1, z1, a1) in zip(unit, mass, strict=True):
            np.testing.assert_array_equal(z0, z1)
            np.testing.assert_array_equal(a0, a1)
            y_mix = (s0.y + s1.y) / 2
            np.testing.assert_array_equal(
                H.decide(s0, a0, y_mix, np.zeros(4), 0.05, 2).delta_h,
                H.decide(s1, a1, y_mix, np.zeros(4), 0.05, 2, inv_mass=inv).delta_h)


# ------------------------------------------------------------------ the bundle
@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    x, y = _pooled()
    path = tmp_path_factory.mktemp("mass") / "correlated.npz"
    x_test, y_test = _pooled(1)
    np.savez(path, x_train=x, y_train=y, x_test=x_test[:50], y_test=y_test[:50],
             client_id=np.arange(N) % AGENTS)
    return str(path)


def _keys(path, out, **extra):
    return {"algorithm": "dhmc", "model": "linear-regression", "data": str(path),
            "partition": "natural", "num-clients": AGENTS, "prior-scale": 1.0,
            "dhmc.graph": "ring", "dhmc.mixing-rounds": 5, "dhmc.energy": "taylor",
            "dhmc.warmup": 150, "dhmc.iterations": 300, "eval-every": 1, "output-dir": str(out),
            **{f"dhmc.{k}": v for k, v in extra.items()}}


def _run(keys):
    """Every iteration's server state and the agents' states at the end."""
    exp = build_experiment(parse_run_config(keys))
    exp = exp._replace(config=exp.config.replace(eval_every=1))  # every iteration (the preset: 100)
    clients, iterates = [], {}

    def on_record(update, state, states, virtual_time, dead):
        clients[:] = states

    for _update, state, _ in iterate_in_process(exp, on_record=on_record):
        iterates[state.iteration - 1] = state.last_w  # (m, K, d) after that iteration
    return exp, clients, iterates, state


def _exact(exp):
    x, y = exp.dataset.x_train, exp.dataset.y_train
    cov = np.linalg.inv(x.T @ x + np.eye(x.shape[1]))
    return cov @ (x.T @ y), cov


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["diagonal", "dense"])
def test_mass_matrix_is_agreed_adapted_and_exact(tmp_path, data_path, kind):
    """Ring of 5 with 5 mixing rounds (gossip alone leaves the agents' statistics apart), mass
    matrix adapted in the one window [75, 100) of a 150-iteration warm-up:

    * every agent holds a bitwise IDENTICAL ``M^{-1}`` (the flooded statistics);
    * its diagonal is the window's variance estimate: within 4 standard errors
      (``sqrt(2 / ESS)`` relative, ESS of the window's draws of that coordinate, agents'
      average per chain, 16 chains) of the exact posterior variances, after Stan's shift
      ``n / (n + 5)`` and ``+ 1e-3 (5 / (n + 5))``; for ``dense`` the off-diagonal
      correlations within 4 standard errors ``(1 - r^2) / sqrt(ESS)`` (Fisher) too;
    * the samples after the warm-up (Taylor energy: exact on this Gaussian target) have mean and
      variance within 4 MCSE of the exact posterior, no allowance (the consensus error is
      below 1e-6), and the same assertions fail against the mean moved by 0.5 sd (power)."""
    exp, clients, iterates, state = _run(_keys(data_path, tmp_path, **{"mass-matrix": kind}))
    mats = [np.asarray(c.inv_mass) for c in clients]
    assert all(c.adapted[0] == 1 for c in clients)
    for other in mats[1:]:
        np.testing.assert_array_equal(other, mats[0])
    mean, cov = _exact(exp)
    var = np.diag(cov)
    window = np.stack([iterates[t].mean(axis=0) for t in range(75, 100)], axis=1)  # (K, T, d)
    ess_w = SamplePosterior(window).ess()
    n = window.shape[0] * window.shape[1]
    shrink = n / (n + 5.0)
    got = mats[0] if kind == "diagonal" else np.diag(mats[0])
    expected = shrink * var + 1e-3 * 5 / (n + 5)
    tol = 4 * np.sqrt(2 / ess_w) * shrink * var
    print(f"{kind}: adapted / exact variance {(got / var).round(3)}, 4 se "
          f"{(tol / var).round(3)} (window ESS {ess_w.round(0)})")
    assert np.all(np.abs(got - expected) <= tol), (got, expected, tol)
    if kind == "dense":
        r_got = mats[0] / np.sqrt(np.outer(got, got))
        r_true = cov / np.sqrt(np.outer(var, var))
        i, j = np.triu_indices(D, 1)
        tol_r = 4 * (1 - r_true[i, j] ** 2) / np.sqrt(np.minimum(ess_w[i], ess_w[j]))
        assert np.all(np.abs(r_got[i, j] - r_true[i, j]) <= tol_r), (r_got, r_true, tol_r)
    kept = np.stack([iterates[t] for t in range(150, 450)], axis=2)  # (m, K, T, d)
    chains = kept.mean(axis=0)
    spread = np.var(kept, axis=0).mean(axis=(0, 1)) / var
    assert np.all(spread < 1e-6), spread
    flat = chains.reshape(-1, D)
    ess = SamplePosterior(chains).ess()
    sq_ess = SamplePosterior((chains - flat.mean(0)) ** 2).ess()
    mcse = np.sqrt(var / ess)
    rel = np.abs(flat.var(0) / var - 1)
    print(f"{kind}: mean error {((flat.mean(0) - mean) / mcse).round(2)} MCSE, variance error "
          f"{(rel / np.sqrt(2 / sq_ess)).round(2)} MCSE, ESS {ess.round(0)}")
    assert np.all(np.abs(flat.mean(0) - mean) <= 4 * mcse)
    assert np.all(rel <= 4 * np.sqrt(2 / sq_ess))
    assert np.all(np.abs(flat.mean(0) - (mean + 0.5 * np.sqrt(var))) > 4 * mcse)


def test_mass_matrix_needs_agreed_decisions(tmp_path, data_path):
    with pytest.raises(ConfigError, match="dhmc.mass-matrix"):
        parse_run_config(_keys(data_path, tmp_path, **{"mass-matrix": "dense",
                                                        "decision": "local"}))
    with pytest.raises(ConfigError, match="dhmc.mass-matrix"):
        parse_run_config(_keys(data_path, tmp_path, **{"mass-matrix": "full"}))


@pytest.mark.slow
def test_default_mass_matrix_doubles_ess_per_gradient_on_correlated_skewed_logistic(tmp_path):
    """Issue 33's done-when on a case of our own: logistic regression with equicorrelated
    features (rho 0.8, 5 features + intercept), 800 rows split over 4 agents by label (each holds
    90 % of one label), every dhmc default (16 chains, 200 warm-up, 200 kept) except the mass
    matrix. The default (``auto``: dense here) must at least double the ESS per gradient
    evaluation of ``none`` (the issue's target). Measured: benchmarks/dhmc/mass_matrix.py gives
    4.3x on the 10-agent (rho 0.8, d 5) cell, and this case 3.9x (min ESS 174 -> 683); both
    runs' gradient counts are equal (same iterations, one leapfrog step), so the ratio is the
    min-ESS ratio."""
    rng = np.random.default_rng(33)
    n, d, rho = 800, 5, 0.8
    x = rng.multivariate_normal(np.zeros(d), rho * np.ones((d, d)) + (1 - rho) * np.eye(d), size=n)
    w = rng.normal(0, 1, d) / np.sqrt(d) * 2.0
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ w + 0.3)))).astype(np.int64)
    # agents 0, 1 hold mostly label 0, agents 2, 3 mostly label 1 (90 % of their rows)
    major = rng.random(n) < 0.9
    owner = 2 * np.where(major, y, 1 - y) + rng.integers(0, 2, n)
    path = tmp_path / "skewed.npz"
    np.savez(path, x_train=x, y_train=y, x_test=x[:100], y_test=y[:100], client_id=owner)
    rows = {}
    for setting in ("none", "auto"):
        out = tmp_path / setting
        result = run_in_process(parse_run_config({
            "algorithm": "dhmc", "model": "logistic-regression", "data": str(path),
            "partition": "natural", "num-clients": 4, "seed": 0, "dhmc.iterations": 200,
            "dhmc.mass-matrix": setting, "output-dir": str(out)}), progress=False)
        chains = np.load(out / "posterior.npz")["chains"]
        rows[setting] = (float(np.min(SamplePosterior(chains).ess())),
                         result["history"][-1]["grad_evals"])
    (ess_none, grads_none), (ess_auto, grads_auto) = rows["none"], rows["auto"]
    assert ess_auto / grads_auto >= 2.0 * ess_none / grads_none, rows


def test_auto_mass_is_dense_up_to_200_dimensions_and_diagonal_above():
    # resolve's documented rule: 'auto' is 'diagonal' when d > 200 (d^2 statistics per
    # message), else dense when the last slow window has >= 10 d draws (here 1,000 chains
    # over a 1,000-iteration warm-up: far more than 10 x 201). Boundary: 200 dense, 201
    # diagonal (mutant: the threshold moved to 201).
    assert MM.resolve("auto", 200, 1000, 1000) == "dense"
    assert MM.resolve("auto", 201, 1000, 1000) == "diagonal"


@pytest.mark.parametrize("kind,dim,chains", [("diagonal", 3, 7), ("diagonal", 3, 8),
                                             ("dense", 2, 6), ("dense", 4, 3), ("none", 5, 4)])
def test_block_width_fits_the_lead_and_every_statistic(kind, dim, chains):
    # statistics [n, sum w (d), sum of squares (d) or products (d (d + 1) / 2)] plus the lead
    # value: (1 + size) floats in rows of K chains, so ceil((1 + size) / K) columns, worked out
    # here: diagonal d = 3 has size 7 -> 8 floats: 2 columns of 7 chains, 1 of 8; dense d = 2
    # size 6 -> 7 floats: 2 columns of 6; dense d = 4 size 15 -> 16: 6 of 3; none: 0.
    # (mutant: ceil(size / K), one column short when K divides size)
    want = {("diagonal", 3, 7): 2, ("diagonal", 3, 8): 1, ("dense", 2, 6): 2,
            ("dense", 4, 3): 6, ("none", 5, 4): 0}[(kind, dim, chains)]
    assert MM.block_width(kind, dim, chains) == want
