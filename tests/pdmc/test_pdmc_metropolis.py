"""Fed-PDMC without rate bounds (``pdmc.bounds = metropolis``): grid-interpolated rates and a
Metropolis correction per trajectory (:mod:`fedbayes_flwr.algorithms.pdmc.metropolis`).

The same tests as the exact sampler's, on potentials that hide their bounds: Gaussian exact
moments within 4 MCSE (ESS from ``tfp.mcmc``), KS invariance from exact draws (Bonferroni family
level 1e-3), and on a non-quadratic target (the hyperbolic secant law, whose grid rates are only
approximate) the same checks plus power: dropping the Metropolis step fails the KS test.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedbayes_flwr.algorithms.pdmc import metropolis as MH
from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.algorithms.pdmc.driver import simulate
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference.posterior import SamplePosterior

D, N = 10, 50


class Unbounded(P.Potential):
    """A quadratic potential with its bounds hidden: only ``value``, ``grad``, ``hess_quad``
    (what a user's ``LikelihoodModel`` has), so ``bounds = auto`` picks ``metropolis``."""

    def __init__(self, inner: P.Quadratic):
        self.inner, self.dim = inner, inner.dim

    def grad(self, x):
        return self.inner.grad(x)

    def value(self, x):
        return self.inner.value(x)

    def hess_quad(self, x, v):
        return self.inner.hess_quad(x, v)


class Sech(P.Potential):
    """``w sum_i log cosh(x_i)``: with shares summing to ``w = 1`` the target is the hyperbolic
    secant law, density ``1 / (pi cosh x)``, CDF ``(2 / pi) arctan(e^x)``, variance
    ``pi^2 / 4``, ``E x^4 = 5 pi^4 / 16``; its rates are not affine along lines."""

    def __init__(self, dim: int, weight: float):
        self.dim, self.w = dim, weight

    def value(self, x):
        return self.w * np.sum(np.logaddexp(x, -x), axis=1)

    def grad(self, x):
        return self.w * np.tanh(x)

    def hess_quad(self, x, v):
        return self.w * np.sum(v * v / np.cosh(x) ** 2, axis=1)


def _sech_draws(rng, shape):
    return np.log(np.tan(0.5 * np.pi * rng.random(shape)))


def _sech_cdf(z):
    return 2.0 / np.pi * np.arctan(np.exp(z))


def test_auto_picks_metropolis_only_without_bounds():
    assert MH.resolve("auto", has_bound=True) == "exact"
    assert MH.resolve("auto", has_bound=False) == "metropolis"
    q = P.gaussian_mean_potential(np.zeros((3, 2)), 1.0)
    assert MH.has_bounds(q) and not MH.has_bounds(Unbounded(q)) and not MH.has_bounds(Sech(2, 1))
    # a preconditioned or re-centred potential without bounds stays without (no AttributeError)
    assert not MH.has_bounds(P.precondition(P.recentre(Sech(2, 1), np.ones(2)), np.zeros(2),
                                            np.ones(2)))


@pytest.mark.parametrize("sampler", S.SAMPLERS)
@pytest.mark.parametrize("preconditioner", ["none", "dense"])
def test_exact_moments_on_the_gaussian_example_without_bounds(sampler, preconditioner):
    """Flat prior, N(ybar, I / N) from 4 workers that hide their bounds: every trajectory is
    accepted (a quadratic's signed rate is affine along lines, so the grid rate is the rate),
    and the end points' mean and variance are within 4 MCSE in every coordinate; a mean shifted
    by 0.5 posterior sd fails (power: needs MCSE < 0.125 sd, i.e. ESS > 100... checked)."""
    from tests.pdmc.test_pdmc import _paper_gaussian, _within_mcse

    y = _paper_gaussian()
    pots = [Unbounded(P.gaussian_mean_potential(part, 1.0)) for part in np.array_split(y, 4)]
    prior = P.gaussian_prior_potential(D, None)
    rng = np.random.default_rng(1)
    k = 8
    x0 = y.mean(0) + rng.standard_normal((k, D)) / np.sqrt(N)
    stretch = 1.0 if preconditioner == "none" else np.sqrt(N)  # z has unit sd
    run = simulate(pots, prior, sampler, x0, S.initial_velocity(sampler, rng, k, D),
                   process_time=40.0 * stretch, delta=1.0, seed=4, refresh=1.0 / stretch,
                   burn_in=2.0 * stretch, preconditioner=preconditioner, bounds="auto",
                   trajectory=0.1 * stretch, rate_grid=0.05 * stretch)
    assert run.acceptance == 1.0
    ok, ess = _within_mcse(run.chains, y.mean(0), np.full(D, 1.0 / N))
    assert ok, ess
    assert np.min(ess) > 100
    assert not _within_mcse(run.chains, y.mean(0), np.full(D, 1.0 / N), shift=0.5)[0]
    assert np.all(run.winners[1:] > 0)


def _sech_run(sampler, preconditioner, k, trajectories, grid, seed=3):
    d = 2
    rng = np.random.default_rng(seed)
    pots = [Sech(d, 0.25) for _ in range(4)]
    x0 = _sech_draws(rng, (k, d))
    return simulate(pots, P.gaussian_prior_potential(d, None), sampler, x0,
                    S.initial_velocity(sampler, rng, k, d), process_time=grid * trajectories,
                    delta=1.0, seed=seed, refresh=0.5 if sampler == "bps" else 0.0,
                    preconditioner=preconditioner, bounds="metropolis", trajectory=grid,
                    rate_grid=grid)


INVARIANCE = [(s, pre, target) for s in S.SAMPLERS for pre in ("none", "diagonal", "dense")
              for target in ("gaussian", "sech")]


@pytest.mark.parametrize("sampler, preconditioner, target", INVARIANCE)
def test_invariance_from_exact_draws_without_bounds(sampler, preconditioner, target):
    """2,000 chains from exact draws; after the Metropolis steps every coordinate passes a KS
    test against the exact marginal (Bonferroni over coordinates and the 12 cases, family level
    1e-3). The sech cases use a coarse grid (h = 2 = the trajectory: about 10% rejected) so the
    correction is doing work; the Gaussian ones the exact grid rate with a Gaussian prior."""
    k = 2000
    if target == "sech":
        run = _sech_run(sampler, preconditioner, k, trajectories=3, grid=2.0)
        cdfs = [_sech_cdf] * 2
        assert 0.5 < run.acceptance < 0.99  # the correction rejects some (and not all)
    else:
        d, prior_var = 3, 0.5
        rng = np.random.default_rng(7)
        y = 1.0 + rng.standard_normal((40, d))
        pots = [Unbounded(P.gaussian_mean_potential(part, 1.0)) for part in np.array_split(y, 4)]
        prec = 1.0 / prior_var + len(y)
        mean, sd = y.sum(0) / prec, 1.0 / np.sqrt(prec)
        x0 = mean + sd * rng.standard_normal((k, d))
        stretch = 1.0 if preconditioner == "none" else 1.0 / sd
        run = simulate(pots, P.gaussian_prior_potential(d, prior_var), sampler, x0,
                       S.initial_velocity(sampler, rng, k, d), process_time=stretch, delta=1.0,
                       seed=3, refresh=1.0 / stretch, preconditioner=preconditioner,
                       bounds="metropolis", trajectory=0.5 * stretch, rate_grid=0.25 * stretch)
        cdfs = [stats.norm(mean[j], sd).cdf for j in range(d)]
        assert run.acceptance == 1.0
    level = 1e-3 / (len(cdfs) * len(INVARIANCE))
    for j, cdf in enumerate(cdfs):
        p = stats.kstest(run.x[:, j], cdf).pvalue
        assert p > level, (j, p)
    assert run.events.mean() > 1  # the chains did move through events


@pytest.mark.parametrize("sampler", S.SAMPLERS)
def test_dropping_the_metropolis_step_is_caught(sampler, monkeypatch):
    """Power: with every trajectory accepted (the mutant) the coarse-grid process is not
    sech-invariant and the KS test of the invariance test (same level) fails, on 20,000 chains;
    the real sampler passes on the same chains and seeds."""
    level = 1e-3 / (2 * len(INVARIANCE))
    k = 20000
    good = _sech_run(sampler, "none", k, trajectories=4, grid=2.0)
    assert all(stats.kstest(good.x[:, j], _sech_cdf).pvalue > level for j in range(2))
    monkeypatch.setattr(MH, "path_terms", lambda pot, smp, path, h, m, k: (np.zeros(k), 0))
    monkeypatch.setattr(MH, "end_terms", lambda pot, x0, x1: np.zeros(x0.shape[0]))
    bad = _sech_run(sampler, "none", k, trajectories=4, grid=2.0)
    assert bad.acceptance == 1.0
    assert min(stats.kstest(bad.x[:, j], _sech_cdf).pvalue for j in range(2)) < level


def test_moments_on_a_non_gaussian_target_within_4_mcse():
    """The hyperbolic secant target from one over-dispersed start per chain (Zig-Zag, coarse
    grid h = 1): mean 0 within 4 sd / sqrt(ESS_x) and variance pi^2 / 4 within
    4 sd(x^2) / sqrt(ESS_{x^2}), sd(x^2) = sqrt(E x^4 - (E x^2)^2) = pi^2 / 2."""
    d, k = 2, 8
    rng = np.random.default_rng(5)
    pots = [Sech(d, 0.5), Sech(d, 0.5)]
    run = simulate(pots, P.gaussian_prior_potential(d, None), "zigzag",
                   3.0 * rng.standard_normal((k, d)), S.initial_velocity("zigzag", rng, k, d),
                   process_time=1500.0, delta=1.0, seed=5, burn_in=50.0, bounds="metropolis",
                   trajectory=1.0, rate_grid=1.0)
    assert 0.5 < run.acceptance < 1.0
    chains = run.chains
    ess_x = SamplePosterior(chains).ess()
    ess_sq = SamplePosterior(chains**2).ess()
    flat = chains.reshape(-1, d)
    var, sd_sq = np.pi**2 / 4, np.pi**2 / 2
    assert np.all(np.abs(flat.mean(0)) <= 4 * np.sqrt(var) / np.sqrt(ess_x)), ess_x
    assert np.all(np.abs((flat**2).mean(0) - var) <= 4 * sd_sq / np.sqrt(ess_sq)), ess_sq
    assert np.min(ess_sq) > 200


# ------------------------------------------------------------------ the bundle
GM = {"algorithm": "pdmc", "model": "gaussian-mean", "dataset": "synthetic",
      "synthetic-dim": 3, "synthetic-size": 60, "num-clients": 4, "partition": "iid",
      "prior-scale": 1.0}


@pytest.mark.parametrize("sampler", S.SAMPLERS)
def test_bundle_metropolis_matches_the_exact_posterior(tmp_path, sampler):
    """``pdmc.bounds = metropolis`` through the generic engine (4 workers, Gaussian prior, the
    dense preconditioner of ``auto``): every trajectory accepted (quadratic shares), and the
    end points' mean and variance within 4 MCSE of the conjugate posterior."""
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.models import exact_posterior
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process
    from fedbayes_flwr.runtime.experiment import build_experiment
    from tests.pdmc.test_pdmc import _within_mcse

    keys = {**GM, "pdmc.bounds": "metropolis",
            "algorithm": "pdmc" if sampler == "zigzag" else "pdmc-bps"}
    result = run_in_process(parse_run_config({**keys, "output-dir": str(tmp_path),
                                              "pdmc.process-time": 40.0}), progress=False)
    assert result["outcome"] == "done"
    diag = result["history"][-1]["diagnostics"]
    assert diag["bounds"] == "metropolis" and diag["acceptance"] == 1.0
    assert diag["preconditioner"] == "dense"
    exp = build_experiment(parse_run_config({**keys, "output-dir": "unused"}))
    mean, cov = G.to_moments(exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None))
    chains = np.load(tmp_path / "posterior.npz")["chains"]
    assert chains.shape[:2] == (16, 37)  # the end points at t = 4, 5, ..., 40 (burn-in 10%)
    ok, ess = _within_mcse(chains, mean, np.diag(cov))
    assert ok, ess


def test_settings_and_refusals():
    from fedbayes_flwr.errors import ConfigError
    from fedbayes_flwr.runtime.config import parse_run_config

    with pytest.raises(ConfigError, match="PDMC needs rate bounds.*pdmc.bounds=metropolis"):
        parse_run_config({"algorithm": "pdmc", "model": "bnn-classifier", "pdmc.bounds": "exact"})
    parse_run_config({"algorithm": "pdmc", "model": "bnn-classifier"})  # auto: metropolis
    for key, value, match in [("pdmc.bounds", "nuts", "pdmc.bounds: unknown bounds 'nuts'"),
                              ("pdmc.trajectory", 0.0, "pdmc.trajectory: must be > 0"),
                              ("pdmc.rate-grid", -1.0, "pdmc.rate-grid: must be > 0")]:
        with pytest.raises(ConfigError, match=match):
            parse_run_config({**GM, key: value})
    with pytest.raises(ConfigError, match="pdmc.bounds: metropolis with dp-epsilon"):
        parse_run_config({**GM, "pdmc.bounds": "metropolis", "pdmc.dp-epsilon": 1.0,
                          "pdmc.preconditioner": "none"})
    with pytest.raises(ConfigError, match="pdmc.dp-epsilon: 'bnn-classifier' has no rate"):
        parse_run_config({"algorithm": "pdmc", "model": "bnn-classifier",
                          "pdmc.dp-epsilon": 1.0})


def _cli(tmp_path, run_config: str):
    import json

    import run_simulation

    out = tmp_path / "run"
    code = run_simulation.main(["--engine", "in-process", "--quiet", "--num-clients", "3",
                                "--seed", "0", "--output-dir", str(out), "--run-config",
                                run_config])
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    with np.load(out / "posterior.npz") as post:
        chains = post["chains"]
    return result, chains


def test_a_likelihood_model_without_a_rate_bound_runs(tmp_path):
    """The user's Poisson regression (no ``rate_bound``: refused before) samples end to end
    with ``pdmc.bounds = auto``, preconditioned (dense, by polarisation of ``hess_quad``)."""
    from tests.models.test_likelihood_model import PLUGIN, _poisson_data

    data = _poisson_data(tmp_path / "data.npz")
    result, chains = _cli(tmp_path, f"algorithm='pdmc' model-modules='{PLUGIN}' "
                                    f"model='user-poisson' data='{data}' partition='iid' "
                                    f"pdmc.process-time=10.0 pdmc.num-chains=4")
    assert result["outcome"] == "done"
    diag = result["history"][-1]["diagnostics"]
    assert diag["bounds"] == "metropolis" and diag["preconditioner"] == "dense"
    assert 0.5 < diag["acceptance"] <= 1.0
    assert chains.shape[:2] == (4, 10) and np.all(np.isfinite(chains))
    assert np.isfinite(result["final"]["test_rmse"])


def test_a_small_bnn_runs(tmp_path):
    """bnn-classifier (hidden layer 4, digits: d = 310, no Hessian bound) runs a few
    trajectories in the model's coordinates (``auto`` gives no preconditioner above d = 100)."""
    result, chains = _cli(tmp_path, "algorithm='pdmc' model='bnn-classifier' hidden-layers='4' "
                                    "dataset='digits' pdmc.process-time=0.02 "
                                    "pdmc.num-chains=4 pdmc.trajectory=0.005 "
                                    "pdmc.rate-grid=0.0025 eval-every=20")
    assert result["outcome"] == "done"
    diag = result["history"][-1]["diagnostics"]
    assert diag["bounds"] == "metropolis" and diag["preconditioner"] == "none"
    assert diag["trajectories"] == 4 and diag["acceptance"] > 0.5
    assert result["final"]["events"] > 0
    assert chains.shape == (4, 4, 310) and np.all(np.isfinite(chains))


def test_each_worker_gets_its_own_events_and_the_pieces_add_up():
    """The bundle's bookkeeping: worker ``pid`` is ``pid + 1`` in the combine (every reply
    present, sorted by pid), so it receives winner 1 exactly at its events; and the share of
    ``log alpha`` summed exchange by exchange equals the share over the whole path."""
    from fedbayes_flwr.algorithms.pdmc.bundle import Prev, _mine

    k, d = 5, 2
    winner = np.array([-1, 0, 1, 2, 1])
    prev = Prev(np.zeros((k, d)), np.ones((k, d)), np.zeros(k), np.ones(k), np.ones((k, d)),
                winner)
    np.testing.assert_array_equal(_mine(prev, 0).winner, [-1, -1, 1, -1, 1])
    np.testing.assert_array_equal(_mine(prev, 1).winner, [-1, -1, -1, 1, -1])
    own = S.Proposal(np.array([np.inf, 0.1, np.inf, np.inf, np.inf]), np.zeros((k, d)), 0)
    w = [S.Proposal(np.array([np.inf, 1, 0.2, 1, 0.3]), np.zeros((k, d)), 0),
         S.Proposal(np.array([np.inf, 1, 1, 0.4, 1]), np.zeros((k, d)), 0)]
    np.testing.assert_array_equal(S.combine(own, w, 1.0)[2], winner)
    # additivity over exchanges, on a non-quadratic potential with events of this worker
    rng = np.random.default_rng(0)
    pot, h = Sech(d, 0.5), 0.3
    x, v, clock = rng.standard_normal((k, d)), S.initial_velocity("zigzag", rng, k, d), np.zeros(k)
    path, total = MH.empty_path(d), np.zeros(k)
    for _ in range(4):
        prop = MH.propose(pot, "zigzag", x, v, clock, np.full(k, 0.7), h, rng)
        tau = np.minimum(prop.tau, 0.7)
        won = np.where(np.isfinite(prop.tau), 1, -1)
        after = np.where(won[:, None] == 1, prop.velocity, v)
        total += MH.path_terms(pot, "zigzag", MH.piece(x, v, clock, tau, after, won), h, 1, k)[0]
        path = MH.extend(path, x, v, clock, tau, won == 1, after, won)
        x, v, clock = x + v * tau[:, None], after, clock + tau
    assert path.event_chain.size > 0
    np.testing.assert_allclose(total, MH.path_terms(pot, "zigzag", path, h, 1, k)[0],
                               rtol=1e-12, atol=1e-12)


def test_a_share_of_plus_infinity_is_rejected():
    """``-inf`` is a valid share (a reversed event of rate 0: certain rejection), ``+inf``
    would force acceptance and is refused; NaN is refused by the generic check."""
    from fedbayes_flwr.algorithms.pdmc.bundle import ACCEPT, GRID, AcceptUp, GridUp, _check
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment

    exp = build_experiment(parse_run_config({**GM, "pdmc.bounds": "metropolis",
                                             "output-dir": "unused"}))
    state = exp.bundle.init_server(exp.setup)
    k, d = state.x.shape
    good = np.full(k, -np.inf)
    assert _check(state, exp.setup, ACCEPT, AcceptUp(good, 0, 1)) is None
    bad = good.copy()
    bad[0] = np.inf
    assert _check(state, exp.setup, ACCEPT, AcceptUp(bad, 0, 1))[0] == "term"
    up = GridUp(np.ones(k), state.v.copy(), bad, 0, 1)
    assert _check(state, exp.setup, GRID, up)[0] == "term"
    assert _check(state, exp.setup, GRID, up._replace(term=good)) is None


@pytest.mark.parametrize("sampler", S.SAMPLERS)
def test_dropping_the_event_terms_is_caught(sampler, monkeypatch):
    """Power for the event terms alone (``log lambda~^rev / lambda~`` at each worker's own
    events; the bundle's per-worker bookkeeping feeds them): keeping the target ratio and the
    rate integrals but dropping them fails the KS test at the invariance test's level on
    100,000 chains (measured p-values 1e-10 to 1e-14 for Zig-Zag, 2e-10 to 3e-8 for BPS; the
    real sampler's, on the same seeds, 0.01 to 0.7)."""
    level = 1e-3 / (2 * len(INVARIANCE))
    real = MH.path_terms

    def no_events(pot, smp, path, h, me, k):
        return real(pot, smp, path._replace(event_winner=np.full_like(path.event_winner, -1)),
                    h, me, k)

    monkeypatch.setattr(MH, "path_terms", no_events)
    bad = _sech_run(sampler, "none", 100_000, trajectories=4, grid=2.0)
    assert min(stats.kstest(bad.x[:, j], _sech_cdf).pvalue for j in range(2)) < level


@pytest.mark.parametrize("sampler", ["zigzag", "bps"])
def test_interpolated_rate_is_exact_for_a_linear_gradient(sampler):
    # The signed rate at the point itself: Zig-Zag v_i x_i per coordinate, BPS v . x. Linear
    # interpolation between the cell's ends (clock 0.37 in the cell [0.25, 0.5) of step 0.25)
    # reproduces a linear rate exactly; 2 gradient batches per call. (Mutant: the right end
    # taken on the wrong side of the point.)
    point = np.array([[1.0, -2.0], [0.5, 0.25]])
    v = np.array([[1.0, -1.0], [-1.0, -1.0]])
    pot = P.gaussian_prior_potential(2, 1.0)  # U = |x|^2 / 2: gradient x, linear along a line
    rate, cost = MH._interp(pot, sampler, point, v, np.array([0.37, 0.37]), 0.25)
    want = v * point if sampler == "zigzag" else np.sum(v * point, axis=1)
    np.testing.assert_allclose(rate, want, rtol=1e-12, atol=1e-12)
    assert cost == 4


def test_a_path_keeps_only_the_chains_that_moved():
    # extend's contract: pieces for every chain with tau > 0 (a chain stopped at its
    # trajectory's end has tau = 0 and adds no piece: mutant `>= 0` adds zero-length pieces,
    # whose cells path_terms would then pay gradients for); events where `event` is set.
    x = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    v = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]])
    tau = np.array([0.5, 0.0, 0.25])
    event = np.array([True, False, False])
    after = np.array([[-1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]])
    path = MH.extend(MH.empty_path(2), x, v, np.array([0.1, 1.0, 0.2]), tau, event, after,
                     np.array([2, -1, -1]))
    np.testing.assert_array_equal(path.piece_chain, [0, 2])
    np.testing.assert_array_equal(path.piece_len, [0.5, 0.25])
    np.testing.assert_array_equal(path.piece_clock, [0.1, 0.2])
    np.testing.assert_array_equal(path.event_chain, [0])
    np.testing.assert_array_equal(path.event_clock, [0.6])
    np.testing.assert_array_equal(path.event_x, [[0.5, 0.5]])
    np.testing.assert_array_equal(path.event_winner, [2])
