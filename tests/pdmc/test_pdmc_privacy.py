"""Fed-PDMC privacy (:mod:`fedbayes_flwr.algorithms.pdmc.privacy`): the refreshment bound, its inverse,
composition, sensitivities, and the privacy loss of released event times checked numerically.

The numerical checks compute the density of a released proposal ``(tau, i)`` on a grid from two
rate functions that differ by at most ``K_i`` per coordinate: trapezoid integrals of rates that
differ by at most ``K`` differ by at most ``t K``, so the pointwise bound is checked without
discretisation slack (only floating-point tolerance).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedbayes_flwr.algorithms.pdmc import privacy as PR
from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference import sensitivity as SE


# ---------------------------------------------------------------------------- helpers
def _cumulative(t, total_rate):
    """Trapezoid ``int_0^t total_rate``, on the grid."""
    steps = 0.5 * (total_rate[1:] + total_rate[:-1]) * np.diff(t)
    return np.concatenate([[0.0], np.cumsum(steps)])


def _release(t, lam, rho):
    """``log f(t, i)`` on the grid ``(n_t, d)`` and ``log P(tau > t)`` ``(n_t,)``."""
    log_surv = -_cumulative(t, np.sum(lam + rho, axis=1))
    return np.log(lam + rho) + log_surv[:, None], log_surv


def _max_log_ratio(t, lam, lam2, rho):
    """The largest ``|log f / f~|`` over the grid and the censoring atom at the grid's end."""
    f, s = _release(t, lam, rho)
    g, s2 = _release(t, lam2, rho)
    return max(float(np.max(np.abs(f - g))), abs(float(s[-1] - s2[-1])))


def _smooth_pair(rng, t, k):
    """Rates ``(a + b t + c sin(w t))^+`` and a neighbour moved by ``k_i s_i(t)``, ``|s| <= 1``,
    then clipped at 0 (the positive part is 1-Lipschitz: the difference stays ``<= k``)."""
    d = k.size
    a, b, c = rng.normal(0, 2, d), rng.normal(0, 3, d), rng.normal(0, 2, d)
    w, phase = rng.uniform(1, 20, d), rng.uniform(0, 2 * np.pi, d)
    raw = a + b * t[:, None] + c * np.sin(w * t[:, None])
    move = k * np.cos(rng.uniform(1, 30, d) * t[:, None] + phase)
    return np.maximum(raw, 0.0), np.maximum(raw + move, 0.0)


def _logistic_data(rng, n, p, bound):
    xi = SE.clip_features(rng.normal(0, 1.5, (n, p)), bound)
    eta = (rng.random(n) < 0.5).astype(float)
    design = np.concatenate([xi, np.ones((n, 1))], axis=1)  # intercept last, as the model's
    return design, eta


def _zigzag_rates(potential, x0, v, t):
    """``lambda_i(s) = (v_i d_i U(x0 + v s))^+`` along the line, ``(n_t, d)``."""
    return np.maximum(v * potential.grad(x0 + t[:, None] * v), 0.0)


# ---------------------------------------------------------------------------- the bound
MODES = [  # (sensitivity, dim, horizon, delta)
    (1.0, 6, 0.1, 0.0),                               # pure, with the horizon
    (np.array([0.5, 2.0, 1.0]), None, 0.05, 0.0),     # pure, per-coordinate K
    (1.0, 6, math.inf, 1e-6),                         # (epsilon, delta), no horizon
    (np.array([0.5, 2.0, 1.0]), None, 0.5, 1e-5),     # (epsilon, delta) with a horizon
]


@pytest.mark.parametrize("sens, dim, horizon, delta", MODES)
def test_bound_is_monotone(sens, dim, horizon, delta):
    kw = dict(dim=dim, horizon=horizon, delta=delta)
    ksum = float(np.sum(np.broadcast_to(sens, (dim or np.size(sens),))))
    floor = horizon * ksum if delta == 0 else 0.0
    eps = floor + np.geomspace(1e-3, 20.0, 60)
    rhos = np.array([PR.refresh_for_epsilon(e, sens, **kw) for e in eps])
    assert np.all(np.isfinite(rhos)) and np.all(rhos > 0)
    assert np.all(np.diff(rhos) < 0), "a larger epsilon must need a smaller refreshment rate"
    losses = np.array([PR.epsilon_of(r, sens, **kw) for r in np.geomspace(1e-2, 1e5, 60)])
    assert np.all(np.diff(losses) < 0), "more refreshment must mean less privacy loss"


@pytest.mark.parametrize("sens, dim, horizon, delta", MODES)
def test_inverse_round_trip(sens, dim, horizon, delta):
    kw = dict(dim=dim, horizon=horizon, delta=delta)
    ksum = float(np.sum(np.broadcast_to(sens, (dim or np.size(sens),))))
    floor = horizon * ksum if delta == 0 else 0.0
    for e in floor + np.array([1e-3, 0.01, 0.1, 0.5, 1.0, 3.0, 10.0]):
        rho = PR.refresh_for_epsilon(e, sens, **kw)
        assert PR.epsilon_of(rho, sens, **kw) == pytest.approx(e, rel=1e-9)
        assert PR.epsilon_of(rho, sens, **kw) <= e * (1 + 1e-12)  # never above the target
    for rho in [0.1, 1.0, 10.0, 1e3]:
        e = PR.epsilon_of(rho, sens, **kw)
        assert PR.refresh_for_epsilon(e, sens, **kw) == pytest.approx(rho, rel=1e-9)


def test_both_regimes_of_the_delta_window_round_trip():
    """With a horizon and delta, small rho is horizon-limited (pure DP reported), large rho is
    delta-limited: the inverse is right on both sides of the switch."""
    sens, d, h, delta = 1.0, 4, 0.5, 1e-4
    switch = math.log(1 / delta) / (d * h)  # rho where log(1/delta)/(d rho) = H
    low, high = PR.privacy_of(switch / 3, sens, dim=d, horizon=h, delta=delta), PR.privacy_of(
        switch * 3, sens, dim=d, horizon=h, delta=delta)
    assert low.delta == 0.0 and high.delta == delta
    assert low.epsilon == pytest.approx(math.log1p(3 / switch) + h * d)
    for g in (low, high):
        rho = PR.refresh_for_epsilon(g.epsilon, sens, dim=d, horizon=h, delta=delta)
        assert PR.epsilon_of(rho, sens, dim=d, horizon=h, delta=delta) == pytest.approx(
            g.epsilon, rel=1e-9)


def test_closed_forms():
    # pure: rho = K / (exp(eps - H d K) - 1)
    assert PR.refresh_for_epsilon(1.0, 2.0, dim=3, horizon=0.1) == pytest.approx(
        2.0 / math.expm1(1.0 - 0.1 * 3 * 2.0))
    # (eps, delta), uniform K, no horizon: eps = log(1 + K/rho) + (K/rho) log(1/delta)
    r = 0.01
    assert PR.epsilon_of(1.0 / r, 1.0, dim=5, delta=1e-6) == pytest.approx(
        math.log1p(r) + r * math.log(1e6))
    assert PR.epsilon_of(3.0, 0.0, dim=2, horizon=1.0) == 0.0
    assert PR.refresh_for_epsilon(0.5, 0.0, dim=2, horizon=1.0) == 0.0
    assert PR.epsilon_of(0.0, 1.0, dim=2, horizon=1.0) == math.inf


def test_unreachable_targets_are_refused():
    with pytest.raises(ValueError, match="out of reach"):
        PR.refresh_for_epsilon(0.5, 1.0, dim=6, horizon=0.1)  # H d K = 0.6 > 0.5
    with pytest.raises(ValueError, match="finite horizon"):
        PR.epsilon_of(10.0, 1.0, dim=2)
    with pytest.raises(ValueError, match="finite horizon"):
        PR.refresh_for_epsilon(1.0, 1.0, dim=2)
    with pytest.raises(ValueError, match="disagrees"):
        PR.epsilon_of(1.0, [1.0, 2.0], dim=3, horizon=1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        PR.epsilon_of(1.0, -1.0, horizon=1.0)


# ---------------------------------------------------------------------------- numerical privacy loss
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_pure_privacy_loss_of_one_release_is_within_epsilon(seed, epsilon):
    rng = np.random.default_rng(seed)
    d = 4
    k = rng.uniform(0.2, 2.0, d)
    horizon = 0.2 * epsilon / k.sum()  # leaves room: H sum K = 0.2 epsilon
    rho = PR.refresh_for_epsilon(epsilon, k, dim=None, horizon=horizon)
    t = np.linspace(0.0, horizon, 4001)
    for _ in range(5):
        lam, lam2 = _smooth_pair(rng, t, k)
        assert np.all(np.abs(lam - lam2) <= k + 1e-12)
        assert _max_log_ratio(t, lam, lam2, rho) <= epsilon * (1 + 1e-10)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
def test_worst_case_is_within_epsilon_and_the_bound_is_tight(epsilon):
    """Rates 0 until just before the horizon, then K on the released coordinate, against K
    everywhere except there: the loss at the horizon approaches the bound (it is attained, up to
    the last grid step), and constant rates 0 vs K reach at least half of it."""
    d, k, horizon = 3, 1.0, 0.5 * epsilon / 3.0
    rho = PR.refresh_for_epsilon(epsilon, k, dim=d, horizon=horizon)
    t = np.linspace(0.0, horizon, 20001)
    lam = np.zeros((t.size, d))
    lam[-1, 0] = k  # coordinate 0 fires at rate K only at the very end
    worst = _max_log_ratio(t, lam, k - lam, rho)
    assert worst <= epsilon * (1 + 1e-10)
    assert worst >= 0.999 * epsilon
    zero, const = np.zeros((t.size, d)), np.full((t.size, d), k)
    assert 0.5 * epsilon * (1 - 1e-9) <= _max_log_ratio(t, zero, const, rho) <= epsilon


@pytest.mark.parametrize("seed", range(4))
def test_approximate_dp_hockey_stick_is_within_delta(seed):
    """No horizon, delta > 0: the pointwise loss is within epsilon on tau <= log(1/delta)/(d rho)
    and the hockey-stick divergence ``sum_i int (f - e^eps f~)^+ + tail`` is at most delta both
    ways."""
    rng = np.random.default_rng(100 + seed)
    d, epsilon, delta = 3, 1.0, 1e-3
    k = rng.uniform(0.5, 1.5, d)
    rho = PR.refresh_for_epsilon(epsilon, k, dim=None, delta=delta)
    window = math.log(1 / delta) / (d * rho)
    t_end = 4.0 * window  # P(tau > t_end) <= delta^4
    t = np.linspace(0.0, t_end, 40001)
    lam, lam2 = _smooth_pair(rng, t, k)
    inside = t <= window
    assert _max_log_ratio(t[inside], lam[inside], lam2[inside], rho) <= epsilon * (1 + 1e-10)
    f, s = _release(t, lam, rho)
    # the smooth pair, and the adversarial 0 vs K_i (whose loss passes epsilon for large tau,
    # so that its hockey-stick divergence is positive: the check is not vacuous)
    for other in (lam2, np.broadcast_to(k, lam.shape)):
        g, s2 = _release(t, other, rho)
        for a, b, sa in ((f, g, s), (g, f, s2)):
            excess = np.maximum(np.exp(a) - np.exp(epsilon + b), 0.0)
            mass = np.sum(0.5 * (excess[1:] + excess[:-1]) * np.diff(t)[:, None])
            assert mass + math.exp(sa[-1]) <= delta * 1.01  # 1%: trapezoid error only
    g, _ = _release(t, np.zeros_like(lam), rho)
    h, _ = _release(t, np.broadcast_to(k, lam.shape), rho)
    excess = np.maximum(np.exp(g) - np.exp(epsilon + h), 0.0)
    assert np.sum(0.5 * (excess[1:] + excess[:-1]) * np.diff(t)[:, None]) > delta / 100
    # and the total mass is 1 (the grid is fine enough for the check above to mean something)
    total = np.sum(0.5 * (np.exp(f[1:]) + np.exp(f[:-1])) * np.diff(t)[:, None]) + math.exp(s[-1])
    assert total == pytest.approx(1.0, abs=1e-4)


# ---------------------------------------------------------------------------- sensitivities
def test_logistic_sensitivity_bounds_rate_changes_and_the_loss():
    """Neighbouring logistic data sets (one row removed, or replaced) along random lines:
    ``|lambda_i - lambda~_i| <= K_i``, and the released time's loss is within epsilon."""
    rng = np.random.default_rng(7)
    p, n, clip = 3, 40, 2.0
    design, eta = _logistic_data(rng, n, p, clip)
    bound = SE.feature_bound(design[:, :p], clip=clip)
    k_add = SE.logistic_sensitivity(bound)
    k_rep = SE.logistic_sensitivity(bound, neighbours="replace")
    assert k_add.shape == (p + 1,) and k_add[-1] == 1.0 and np.allclose(k_rep, 2 * k_add)
    full = P.Logistic(design, eta)
    removed = P.Logistic(design[1:], eta[1:])
    other = np.concatenate([SE.clip_features(rng.normal(0, 3, (1, p)), clip), [[1.0]]], axis=1)
    replaced = P.Logistic(np.concatenate([other, design[1:]]), np.concatenate([[1.0], eta[1:]]))
    epsilon, horizon = 1.0, 0.02
    rho = PR.refresh_for_epsilon(epsilon, k_add, dim=None, horizon=horizon)
    rho_rep = PR.refresh_for_epsilon(epsilon, k_rep, dim=None, horizon=horizon)
    t = np.linspace(0.0, horizon, 1001)
    for _ in range(20):
        x0 = rng.normal(0, 3, p + 1)
        v = rng.choice([-1.0, 1.0], p + 1)
        lam = _zigzag_rates(full, x0[None, :], v, t)
        lam_rm = _zigzag_rates(removed, x0[None, :], v, t)
        lam_rep = _zigzag_rates(replaced, x0[None, :], v, t)
        assert np.all(np.abs(lam - lam_rm) <= k_add + 1e-9)
        assert np.all(np.abs(lam - lam_rep) <= k_rep + 1e-9)
        assert _max_log_ratio(t, lam, lam_rm, rho) <= epsilon * (1 + 1e-10)
        assert _max_log_ratio(t, lam, lam_rep, rho_rep) <= epsilon * (1 + 1e-10)


def test_feature_bound_and_clipping():
    x = np.array([[0.5, -3.0], [-1.0, 2.0]])
    assert np.allclose(SE.feature_bound(x), [1.0, 3.0])
    assert np.allclose(SE.feature_bound(SE.clip_features(x, 1.5), clip=1.5), [1.5, 1.5])
    with pytest.raises(ValueError, match="clip"):
        SE.feature_bound(x, clip=1.5)


def test_gaussian_mean_and_bps_are_refused():
    with pytest.raises(SE.UnboundedSensitivityError, match="unbounded"):
        SE.gaussian_mean_sensitivity(np.zeros((3, 2)), noise_scale=1.0)
    with pytest.raises(ValueError, match="Zig-Zag"):
        PR.check_sampler("bps")
    PR.check_sampler("zigzag")


# ---------------------------------------------------------------------------- composition
def test_composition_adds_up():
    assert PR.composed_epsilon(0.01, 250) == pytest.approx(2.5)
    g = PR.compose(0.1, 30, per_event_delta=1e-7)
    assert g.epsilon == pytest.approx(3.0) and g.delta == pytest.approx(3e-6)
    assert PR.compose(0.3, 0) == (0.0, 0.0)
    # composing in two halves adds up to composing at once
    rho = PR.refresh_for_epsilon(0.05, 1.0, dim=4, horizon=0.01)
    per = PR.epsilon_of(rho, 1.0, dim=4, horizon=0.01)
    assert PR.composed_epsilon(per, 40) + PR.composed_epsilon(per, 60) == pytest.approx(
        PR.composed_epsilon(per, 100))


def test_advanced_composition_formula_and_regime():
    k, eps, slack = 10_000, 0.01, 1e-6
    adv = PR.compose(eps, k, per_event_delta=1e-9, method="advanced", delta_slack=slack)
    expected = math.sqrt(2 * k * math.log(1 / slack)) * eps + k * eps * math.expm1(eps)
    assert adv.epsilon == pytest.approx(expected)
    assert adv.delta == pytest.approx(k * 1e-9 + slack)
    assert adv.epsilon < PR.composed_epsilon(eps, k)  # many small releases: advanced wins
    with pytest.raises(ValueError, match="delta'"):
        PR.compose(eps, k, method="advanced")
    with pytest.raises(ValueError, match="method"):
        PR.compose(eps, k, method="renyi")


# ---------------------------------------------------------------------------- the sampler's releases
def test_sampler_releases_the_analysed_distribution():
    """The worker's proposals with ``rate_shift = rho`` (thinning, logistic potential) have the
    first-arrival law the bound is about: KS on tau (censored at the horizon) against the grid
    CDF ``1 - exp(-int sum_j (lambda_j + rho))``, and the flipped coordinate's frequencies."""
    rng = np.random.default_rng(3)
    p = 2
    design, eta = _logistic_data(rng, 30, p, 2.0)
    pot = P.Logistic(design, eta)
    d, n = p + 1, 20_000
    x0, v = rng.normal(0, 1, d), rng.choice([-1.0, 1.0], d)
    horizon, rho = 0.3, 2.0
    prop = S.propose(pot, "zigzag", np.tile(x0, (n, 1)), np.tile(v, (n, 1)),
                     np.full(n, horizon), np.random.default_rng(11), rate_shift=rho)
    t = np.linspace(0.0, horizon, 20001)
    lam = _zigzag_rates(pot, x0[None, :], v, t)
    f, log_surv = _release(t, lam, rho)
    cdf = 1.0 - np.exp(log_surv)
    tau = prop.tau
    none = ~np.isfinite(tau)
    assert abs(none.mean() - np.exp(log_surv[-1])) < 5 * math.sqrt(
        np.exp(log_surv[-1]) * (1 - np.exp(log_surv[-1])) / n)
    ecdf = np.searchsorted(np.sort(tau[~none]), t, side="right") / n
    assert np.max(np.abs(ecdf - cdf)) < 1.95 / math.sqrt(n)  # KS at about 0.1 %
    flipped = np.argmax(prop.velocity[~none] != v, axis=1)
    mass = np.sum(0.5 * (np.exp(f[1:]) + np.exp(f[:-1])) * np.diff(t)[:, None], axis=0)
    freq = np.bincount(flipped, minlength=d) / n
    assert np.all(np.abs(freq - mass) < 5 * np.sqrt(mass * (1 - mass) / n) + 1e-4)


# --- mutants of the sweep (seed 0) -------------------------------------------------------------

def test_per_coordinate_sensitivities_beyond_small_int_caching():
    # 300 per-coordinate sensitivities with dim = 300: (K_max, sum K_j, d) = (2e-4, 0.045, 300),
    # no refusal (mutant `!=` -> `is not` compares int objects: distinct above 256)
    k = np.full(300, 1.5e-4)
    k[7] = 2e-4
    kmax, ksum, d = PR._sensitivities(k, 300)
    assert (kmax, d) == (2e-4, 300) and math.isclose(ksum, 299 * 1.5e-4 + 2e-4, rel_tol=1e-12)
    with pytest.raises(ValueError, match="dim: 299 disagrees with the 300"):
        PR._sensitivities(k, 299)


def test_privacy_signatures_and_defaults():
    # refresh_for_epsilon's dim / horizon / delta are keyword-only (mutant `*` -> `/`)
    with pytest.raises(TypeError):
        PR.refresh_for_epsilon(1.0, 0.1, 1)
    # per-event delta 1 is allowed ([0, 1]): basic composition of 2 gives (0.2, min(1, 2)) = 1
    g = PR.compose(0.1, 2, per_event_delta=1.0)
    assert math.isclose(g.epsilon, 0.2) and g.delta == 1.0
    # composed_epsilon's delta_slack defaults to 0: advanced composition then needs one
    with pytest.raises(ValueError, match=r"needs 0 < delta' < 1, got 0\.0"):
        PR.composed_epsilon(0.1, 3, method="advanced")

