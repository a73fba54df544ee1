"""Baselines of decentralized MH-HMC: centralized one-step HMC and decentralized ULA.

Target: Bayesian linear regression (Gaussian posterior, known exactly), rows split over 5
agents. Tolerances: Monte Carlo errors from the ESS of independent chains (for the
decentralized sampler, of the agents' average per chain; never across agents), 4 standard
errors; ULA is unadjusted, but linear on this target, so it is compared with its own exact
mean path or stationary covariance (closed forms), not with the posterior plus an allowance,
and its consensus error with its exact mean and sd (the state is Gaussian); the acceptance rate
of centralized HMC with MALA's exact acceptance probability at the adapted step.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.algorithms.decentralized import graphs as gossip
from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
from fedbayes_flwr.algorithms.dhmc import agents as H
from fedbayes_flwr.algorithms.dhmc.baselines import (
    PooledPotential,
    centralized_hmc,
    decentralized_ula,
    ula_steps,
)
from fedbayes_flwr.algorithms.dhmc.loop import simulate
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference.posterior import SamplePosterior
from tests.helpers.mcse import mcse_checks

M, N, D = 5, 250, 3


def _data():
    """The regression data (seed 0): ``x (N, D)``, ``y (N,)``."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D))
    y = x @ rng.standard_normal(D) + rng.standard_normal(N)
    return x, y


@pytest.fixture(scope="module")
def problem():
    x, y = _data()
    prior = P.gaussian_prior_potential(D, 1.0)
    pots = [H.LocalPotential(P.linear_regression_potential(x[i], y[i], 1.0), prior, M)
            for i in np.array_split(np.arange(N), M)]
    cov = np.linalg.inv(x.T @ x + np.eye(D))
    return pots, cov @ (x.T @ y), np.diag(cov)


def _ula_exact_mean_path(x, y, m, mix, w0, steps):
    """The exact expectation of every agent's state under decentralized ULA on a Gaussian
    target, computed from the data alone: with ``grad U_i(w) = A_i w - b_i``
    (``A_i = X_i^T X_i + I / m``, ``b_i = X_i^T y_i``; unit noise variance, N(0, I) prior
    shared equally) the recursion ``w_i <- sum_j W_ij w_j - h_t m grad U_i(w_i) + noise`` is
    linear with zero-mean noise, so ``E w_i^{t+1} = sum_j W_ij E w_j^t - h_t m (A_i E w_i^t -
    b_i)``, decentralization bias and decaying-step transient included. Returns ``(T, m, d)``,
    the means after each iteration."""
    d = x.shape[1]
    parts = np.array_split(np.arange(len(x)), m)
    a = np.stack([x[i].T @ x[i] + np.eye(d) / m for i in parts])
    b = np.stack([x[i].T @ y[i] for i in parts])
    mu = np.tile(w0, (m, 1))
    out = []
    for h in steps:
        mu = mix @ mu - h * m * (np.einsum("ijk,ik->ij", a, mu) - b)
        out.append(mu)
    return np.stack(out)


def _ula_shared_noise_consensus(x, y, m, mix, steps, warmup, post_var, chains, lags=250):
    """The exact mean and standard deviation of decentralized ULA's reported consensus error
    (shared noise, ``K = chains`` chains from 0), averaged over the kept iterations.

    Per chain the stacked state ``w (m d,)`` (agent-major) follows the linear recursion
    ``w <- B_t w + h_t m b + sqrt(2 h_t) (1 (x) xi)``, ``B_t = W (x) I_d - h_t m diag(A_i)``
    (``A_i``, ``b_i`` as in :func:`_ula_exact_mean_path`), with one ``xi ~ N(0, I_d)`` shared
    by the agents: it is Gaussian, its mean ``mu_t`` and covariance ``S_t`` obey
    ``mu <- B mu + h m b`` and ``S <- B S B^T + 2 h (11^T (x) I_d)`` from ``0, 0``. The shared
    noise cancels in the disagreement ``(P (x) I) w`` (``P = I - 11^T / m``, ``W`` commutes
    with it), but the heterogeneous ``A_i`` feed the average's fluctuations back into it, so
    ``S_t`` is needed too. The reported error
    (:func:`fedbayes_flwr.algorithms.dhmc.agents.consensus_error`: the agents' variance about
    their average, over ``post_var``, mean over chains and coordinates) is ``w^T Q w`` per
    chain with ``Q = P (x) diag(1 / post_var) / (m d)``, so ``E c_t = tr(Q S_t) + mu_t^T Q
    mu_t``. For the spread of the time average: Gaussian quadratic forms have ``Cov(c_s, c_t)
    = 2 tr(Q C Q C^T) + 4 mu_s^T Q C Q mu_t`` with ``C = Cov(w_s, w_t) = B_{s-1} ... B_t S_t``
    (``s >= t``); ``B`` contracts by about 0.9 a step, so lags past ``lags`` contribute below
    1e-12 of the lag-0 term; the chains are independent, hence the division by ``chains``.
    Returns the mean, the sd and the noise-free part ``mean_t mu_t^T Q mu_t`` (what the
    disagreement would be without the noise)."""
    d = x.shape[1]
    parts = np.array_split(np.arange(len(x)), m)
    a_blocks = np.zeros((m * d, m * d))
    for i, rows in enumerate(parts):
        a_blocks[i * d:(i + 1) * d, i * d:(i + 1) * d] = x[rows].T @ x[rows] + np.eye(d) / m
    b = np.concatenate([x[rows].T @ y[rows] for rows in parts])
    q = np.kron(np.eye(m) - 1.0 / m, np.diag(1.0 / post_var)) / (m * d)
    noise = np.kron(np.ones((m, m)), np.eye(d))
    mu, cov = np.zeros(m * d), np.zeros((m * d, m * d))
    mus, covs, maps = [], [], []
    for t, h in enumerate(steps):
        step_map = np.kron(mix, np.eye(d)) - h * m * a_blocks
        mu = step_map @ mu + h * m * b
        cov = step_map @ cov @ step_map.T + 2 * h * noise
        if t >= warmup:
            mus.append(mu)
            covs.append(cov)
            maps.append(step_map)
    mus, covs, maps = np.array(mus), np.array(covs), np.array(maps)
    kept = len(mus)
    det = np.einsum("ti,ij,tj->t", mus, q, mus)
    expected = np.einsum("ij,tji->t", q, covs) + det
    total, prop = 0.0, np.broadcast_to(np.eye(m * d), covs.shape).copy()  # B_{t+l-1}..B_t
    for lag in range(min(lags, kept)):
        n = kept - lag
        cross = prop[:n] @ covs[:n]  # Cov(w_{t+lag}, w_t)
        qcq = q @ cross @ q
        cv = (2 * np.einsum("tij,tij->t", qcq, cross)
              + 4 * np.einsum("ti,tij,tj->t", mus[lag:], qcq, mus[:n]))
        total += cv.sum() * (1 if lag == 0 else 2)
        prop = maps[lag + 1:][: n - 1] @ prop[: n - 1]
    return expected.mean(), np.sqrt(total / kept**2 / chains), det.mean()


def _mala_acceptance(hess, eps, draws=2_000_000, seed=11):
    """The stationary acceptance probability of one-leapfrog-step HMC (MALA) with step ``eps``
    and unit mass on the Gaussian posterior with precision ``hess``, computed from the data
    alone: ``E[min(1, exp(-Delta H))]`` over ``w`` from the exact posterior and ``p ~ N(0, I)``,
    by plain Monte Carlo over ``draws`` independent pairs (``Delta H`` of a quadratic ``U``
    depends on ``w - mean`` only). Returns the estimate and its standard error."""
    rng = np.random.default_rng(seed)
    chol = np.linalg.cholesky(np.linalg.inv(hess))
    w = rng.standard_normal((draws, len(hess))) @ chol.T  # w - mean ~ N(0, hess^-1)
    p = rng.standard_normal(w.shape)
    p_half = p - 0.5 * eps * w @ hess
    z = w + eps * p_half
    p_new = p_half - 0.5 * eps * z @ hess
    delta_h = 0.5 * (np.einsum("ni,ij,nj->n", z, hess, z) - np.einsum("ni,ij,nj->n", w, hess, w)
                     + (p_new**2).sum(1) - (p**2).sum(1))
    prob = np.minimum(1.0, np.exp(-delta_h))
    return prob.mean(), prob.std() / np.sqrt(draws)


def test_centralized_hmc_matches_the_exact_posterior(problem):
    """Adapted step (dual averaging in the warm-up), 16 chains: mean and variance within 4
    MCSE of the exact Gaussian posterior (one leapfrog step with the exact energy is exact
    MALA: no bias to allow for); the acceptance rate within 4 standard errors of MALA's exact
    stationary acceptance probability at the adapted step.

    The acceptance rate is a mean of ``n = K T`` Bernoulli indicators whose marginal success
    probability, at stationarity, is ``alpha(eps) = E[min(1, exp(-Delta H))]`` over ``w`` from
    the posterior and ``p ~ N(0, I)`` (:func:`_mala_acceptance`, numpy from the data and the
    step, not the sampler). The step after the warm-up is fixed (dual averaging's average), so
    given the seed ``alpha`` is a number, not the adaptation's target 0.6: that target is met
    only up to the adaptation's own error, which has no closed form. Standard error: the
    binomial ``sqrt(alpha (1 - alpha) / n)`` with ``n`` replaced by the ESS of the indicator
    series (16 independent chains; the indicators are correlated through the state), plus, in
    quadrature, the Monte Carlo error of ``alpha`` itself. The indicators are the moves in
    the saved samples (a continuous proposal is never the current state), the first kept one
    excepted: ``accept_rate`` must equal their mean to ``1 / T``. Power: the band is 0.014
    here (ESS ~19000 of 24000 indicators), so a rate 0.03 off (above 8 standard errors) is
    rejected: checked below."""
    pots, mean, var = problem
    x, _ = _data()
    run = centralized_hmc(PooledPotential(pots), np.zeros((16, D)), 0.04, 1500, warmup=200,
                          seed=3)
    assert run.samples.shape == (16, 1500, D)
    assert run.grad_evals == 1 + 1700
    moved = np.any(run.samples[:, 1:] != run.samples[:, :-1], axis=-1).astype(np.float64)
    assert abs(run.accept_rate - moved.mean()) <= 1 / 1500
    alpha, alpha_se = _mala_acceptance(x.T @ x + np.eye(D), run.epsilon)
    ess = SamplePosterior(moved[..., None]).ess()[0]
    se = np.sqrt(alpha * (1 - alpha) / ess + alpha_se**2)
    print(f"acceptance {run.accept_rate:.4f} at eps {run.epsilon:.4f}; exact {alpha:.4f} "
          f"(adaptation target 0.6); error {(run.accept_rate - alpha) / se:.2f} se, 4 se "
          f"{4 * se:.4f}; indicator ESS {ess:.0f} of {moved.size}")
    assert abs(run.accept_rate - alpha) <= 4 * se, (run.accept_rate, alpha, se)
    assert abs(run.accept_rate - (alpha + 0.03)) > 4 * se  # power
    assert abs(run.accept_rate - (alpha - 0.03)) > 4 * se
    # Moments: 4 MCSE (tests/helpers/mcse.py); power: 4 MCSE (printed) is well under
    # 0.25 sd / 0.25, so the same checks against the mean moved by 0.5 sd and the variance
    # scaled by 1.5 fail in every coordinate.
    checks = mcse_checks(run.samples, mean, var, mean_shift=0.5, var_scale=1.5)
    print(f"4 MCSE mean {checks['mean_band'].round(3)} sd, var {checks['var_band'].round(3)}")


def test_centralized_hmc_makes_the_decentralized_moves_at_exact_consensus(problem):
    """Complete graph (``W = 11^T / m``: exact averaging), fixed step, same seed, one warm-up
    iteration with the test off (it puts the trackers at their averages): the decentralized
    sampler and centralized HMC make the same moves to rounding (the Taylor energy is exact
    for a quadratic potential)."""
    pots, mean, _ = problem
    mixing = mixmat.metropolis_weights(gossip.complete(M))
    w0 = np.tile(mean, (8, 1)) + 0.05
    dec = simulate(pots, mixing, w0, 0.05, 200, warmup=1, adapt=False, seed=7,
                   warmup_metropolis=False)
    cen = centralized_hmc(PooledPotential(pots), w0, 0.05, 200, warmup=1, adapt=False,
                          seed=7, warmup_metropolis=False)
    np.testing.assert_allclose(dec.samples, np.broadcast_to(cen.samples, dec.samples.shape),
                               rtol=0, atol=1e-12)
    assert dec.accept_rate == cen.accept_rate and dec.disagreement == 0.0


def test_ula_step_schedule():
    steps = ula_steps(0.01, 1000, decay=0.55, offset=230.0)
    assert steps[0] == 0.01
    np.testing.assert_allclose(steps[999], 0.01 * (230 / 1229) ** 0.55)
    np.testing.assert_array_equal(ula_steps(0.01, 5, decay=0.0), np.full(5, 0.01))


def test_decentralized_ula_on_a_ring(problem):
    """Shared noise, ring of 5, the reference code's decaying step from ``h_0 = 0.04^2 / 2``:
    shapes and cost; the consensus error (mean over the kept iterations) within 4 sd of its
    exact expectation; the agents' average has the exact expectation of its estimator
    (:func:`_ula_exact_mean_path`: ULA is linear on a Gaussian target, so its mean path is
    closed form, bias included) within 4 MCSE.

    Consensus: :func:`_ula_shared_noise_consensus` gives the exact mean and sd of the
    reported average (the state is Gaussian; numpy from the data, an independently built
    ``W`` and the step formula). 4 sd: two-sided, 6e-5 (the average of 16 independent chains'
    time averages of weakly dependent quadratic forms is close to normal). Power: the band is
    about 1.5% of the expectation, so the same check against the expectation moved by 5% (13
    sd) fails, as does the noise-free disagreement (the mean path alone, 2.4% lower: about 6
    sd below the expectation, so caught with probability ~0.98 in general; 8 sd, printed, here).

    4 MCSE: ``sqrt(var / ess)`` per coordinate, the ESS of the agents' average over 16
    independent chains (never across agents); a two-sided 4-sigma band is exceeded with
    probability 6e-5 per coordinate. Power: the same assertion against the expectation shifted
    by 0.2 posterior sd (the old, underived allowance) fails in every coordinate (checked
    below; 4 MCSE is 0.12-0.13 sd here, the exact bias 0.02-0.04 sd)."""
    pots, mean, var = problem
    x, y = _data()
    np.testing.assert_allclose(pots[0].grad(np.ones((1, D)))[0],  # the same potentials
                               x[:50].T @ (x[:50] @ np.ones(D) - y[:50]) + np.ones(D) / M)
    mixing = mixmat.metropolis_weights(gossip.ring(M))
    ring = (np.eye(M) + np.roll(np.eye(M), 1, axis=1) + np.roll(np.eye(M), -1, axis=1)) / 3
    np.testing.assert_allclose(mixing, ring, rtol=0, atol=1e-15)  # Metropolis: 1/3 on a ring
    run = decentralized_ula(pots, mixing, np.zeros((16, D)), 0.04**2 / 2, 1500, warmup=300,
                            noise="shared", posterior_var=var)
    assert run.samples.shape == (M, 16, 1500, D)
    assert run.grad_evals == 1800 and run.steps.shape == (1800,)
    assert run.consensus.shape == (1500,)
    steps = 0.04**2 / 2 * (230 / (230 + np.arange(1800))) ** 0.55  # the reference schedule
    c_mean, c_sd, c_det = _ula_shared_noise_consensus(x, y, M, ring, steps, 300, var, 16)
    measured = run.consensus.mean()
    print(f"consensus {measured:.5f}, exact {c_mean:.5f} (noise-free part {c_det:.5f}), "
          f"sd {c_sd:.2e}: error {(measured - c_mean) / c_sd:.2f} sd, noise-free "
          f"{(c_det - c_mean) / c_sd:.1f} sd")
    assert abs(measured - c_mean) <= 4 * c_sd, (measured, c_mean, c_sd)
    assert abs(measured - 1.05 * c_mean) > 4 * c_sd and abs(measured - 0.95 * c_mean) > 4 * c_sd
    assert abs(measured - c_det) > 4 * c_sd
    path = _ula_exact_mean_path(x, y, M, mixing, np.zeros(D), run.steps)
    expected = path[300:].mean(axis=(0, 1))  # E of the estimator: kept iterations, all agents
    avg = run.samples.mean(axis=0)  # (K, T, d): the agents' average per chain
    ess = SamplePosterior(avg).ess()
    mcse = np.sqrt(var / ess)
    estimate = avg.reshape(-1, D).mean(0)
    print(f"ULA mean error {((estimate - expected) / mcse).round(2)} MCSE; exact bias vs the "
          f"posterior {((expected - mean) / np.sqrt(var)).round(3)} sd; 4 MCSE "
          f"{(4 * mcse / np.sqrt(var)).round(3)} sd")
    assert np.all(np.abs(estimate - expected) <= 4 * mcse), ((estimate - expected) / mcse, ess)
    shifted = expected + 0.2 * np.sqrt(var)
    assert np.all(np.abs(estimate - shifted) > 4 * mcse), ((estimate - shifted) / mcse, ess)
    ratio = run.samples.reshape(-1, D).var(0) / var
    print(f"ULA (shared noise) variance ratio {ratio.round(3)}")


def test_ula_noise_scalings(problem):
    """The noise variants on a complete graph (``W = 11^T / m``: the agents agree after each
    mixing), constant step ``h``: the agents' average is then exactly ULA on the pooled
    potential, ``w <- w - h H (w - mean) + sqrt(2 h) c xi`` with ``xi ~ N(0, I / m)``, whose
    stationary covariance solves ``S = (I - hH) S (I - hH) + (2h c^2 / m) I``:
    ``(c^2 / m) (H (I - h H / 2))^{-1}``. Per-agent noise scaled by ``c = sqrt(m)`` (DE-SGLD)
    gives ``(H (I - hH/2))^{-1}`` (about the posterior's, 2.5% above it here), unscaled noise
    (the seed paper's code) 1/m of that. Each variance ratio within 4 relative MCSE
    (``sqrt(2 / ESS)`` of the squared deviations); power: not the other variant's target."""
    pots, _, var = problem
    x, _ = _data()
    hess = x.T @ x + np.eye(D)
    h = 0.02**2 / 2
    ula = np.diag(np.linalg.inv(hess @ (np.eye(D) - h * hess / 2)))
    targets = {"independent": ula, "reference": ula / M}
    mixing = mixmat.metropolis_weights(gossip.complete(M))
    for noise, target in targets.items():
        run = decentralized_ula(pots, mixing, np.zeros((16, D)), h, 1500,
                                warmup=300, rounds=5, noise=noise, decay=0.0)
        avg = run.samples.mean(axis=0)  # (K, T, d): the agents' average per chain
        flat = avg.reshape(-1, D)
        tol = 4 * np.sqrt(2 / SamplePosterior((avg - flat.mean(0)) ** 2).ess())
        ratio = flat.var(0) / target
        assert np.all(np.abs(ratio - 1) <= tol), (noise, ratio, tol)
        other = targets["reference" if noise == "independent" else "independent"]
        assert not np.all(np.abs(flat.var(0) / other - 1) <= tol)


def test_bad_noise_is_refused(problem):
    pots, _, _ = problem
    with pytest.raises(ValueError, match="noise"):
        decentralized_ula(pots, np.eye(M), np.zeros((2, D)), 0.01, 2, noise="gaussian")


def test_ula_step_schedule_defaults_are_the_reference_codes():
    # h_t = step (230 / (230 + t))^0.55 (the documented defaults: decay 0.55, offset 230),
    # written out; the default call must equal it (mutants: either default changed)
    t = np.arange(50.0)
    np.testing.assert_allclose(ula_steps(0.02, 50), 0.02 * (230.0 / (230.0 + t)) ** 0.55,
                               rtol=1e-14)


def test_a_mixing_matrix_of_the_wrong_size_is_refused(problem):
    # M agents need an M x M mixing matrix: smaller (mutant `!=` -> `>` lets it through) and
    # larger ones are refused, naming the shape
    pots, _, _ = problem
    for size in (M - 1, M + 1):
        with pytest.raises(ValueError, match=rf"mixing is \({size}, {size}\) for {M} agents"):
            decentralized_ula(pots, np.eye(size), np.zeros((2, D)), 0.01, 2)


def test_centralized_hmc_defaults_are_no_warmup_and_seed_zero(problem):
    # documented defaults: warmup 0 (every iteration kept) and seed 0; the default call is the
    # explicit one bit for bit, and seed 1 differs (the check can fail)
    pots, _, _ = problem
    pooled = PooledPotential(pots)
    w0 = np.zeros((2, D))
    plain = centralized_hmc(pooled, w0, 0.05, 6, adapt=False)
    explicit = centralized_hmc(pooled, w0, 0.05, 6, warmup=0, seed=0, adapt=False)
    assert plain.samples.shape[1] == 6
    np.testing.assert_array_equal(plain.samples, explicit.samples)
    other = centralized_hmc(pooled, w0, 0.05, 6, warmup=0, seed=1, adapt=False)
    assert not np.array_equal(plain.samples, other.samples)
