"""Fed-PDMC: event-time inversion, exactness and invariance on Gaussian targets, thinning,
the bundle in-process, failures.

Tolerances come from the maths: Monte Carlo standard errors from the effective sample size
(``tfp.mcmc`` through :class:`fedbayes_flwr.inference.posterior.SamplePosterior`), KS tests against exact
draws with a Bonferroni family level.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedbayes_flwr.algorithms.base import Rejection
from fedbayes_flwr.algorithms.pdmc import precondition as PC
from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.algorithms.pdmc.bundle import Up
from fedbayes_flwr.algorithms.pdmc.driver import simulate
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.steps import judge

D, N = 10, 50  # the paper's Gaussian example: d = 10, N = 50, alpha = 1, mu_0 = 0.5


def _paper_gaussian(seed=0):
    rng = np.random.default_rng(seed)
    return 0.5 + rng.standard_normal((N, D))


def _within_mcse(chains, mean, var, shift=0.0):
    """Mean within 4 MCSE (ESS of x) and variance within 4 MCSE (ESS of (x - mean)^2) of the
    exact values, per coordinate; ``shift`` moves the target mean by that many posterior sd."""
    sd = np.sqrt(var)
    target = mean + shift * sd
    flat = chains.reshape(-1, chains.shape[-1])
    est_mean = flat.mean(0)
    ess_x = SamplePosterior(chains).ess()
    sq = (chains - est_mean) ** 2
    ess_sq = SamplePosterior(sq).ess()
    est_var = sq.reshape(-1, chains.shape[-1]).mean(0)
    # Gaussian: sd of (x - m)^2 is sqrt(2) var
    mean_ok = np.abs(est_mean - target) <= 4 * sd / np.sqrt(ess_x)
    var_ok = np.abs(est_var - var) <= 4 * np.sqrt(2) * var / np.sqrt(ess_sq)
    return bool(np.all(mean_ok) and np.all(var_ok)), ess_x


def test_first_arrival_integrates_the_rate_to_the_exponential():
    rng = np.random.default_rng(0)
    a, b, e = rng.normal(size=2000) * 3, rng.normal(size=2000) * 3, rng.exponential(size=2000)
    t = S.first_arrival(a, b, e)
    finite = np.isfinite(t)
    # integral of (a + b s)^+ over [0, T] by fine quadrature equals e where T is finite
    for ai, bi, ei, ti in zip(a[finite][:200], b[finite][:200], e[finite][:200], t[finite][:200],
                              strict=True):
        s = np.linspace(0, ti, 20001)
        assert np.trapezoid(np.maximum(0, ai + bi * s), s) == pytest.approx(ei, rel=1e-6, abs=1e-9)
    # +inf exactly when the rate never accumulates e: b <= 0 and (a <= 0 or a^2 / (2|b|) < e)
    never = (b <= 0) & ((a <= 0) | (a * a < 2 * np.abs(b) * e))
    np.testing.assert_array_equal(~finite, never)


# every preconditioner with every sampler; the worker counts with "none" (the unpreconditioned
# sampler's own cases), one count each for the others (the transform is the same for any split)
EXACT_CASES = [(s, w, "none") for s in S.SAMPLERS for w in (1, 4, 16)] + [
    (s, 4, pre) for s in S.SAMPLERS for pre in PC.KINDS if pre != "none"]


@pytest.mark.parametrize("sampler, workers, preconditioner", EXACT_CASES)
def test_exact_on_the_papers_gaussian_example(sampler, workers, preconditioner):
    """Flat prior, N(ybar, I / N): mean and variance within 4 MCSE in every coordinate; the same
    check against a mean shifted by 0.5 posterior sd fails (power). Preconditioned, the chains
    run in z with x = m + L z (L L^T the posterior covariance: z has unit sd, so the process
    needs sqrt(N) times more process time for the same ESS; it is given that)."""
    y = _paper_gaussian()
    pots = [P.gaussian_mean_potential(part, 1.0) for part in np.array_split(y, workers)]
    prior = P.gaussian_prior_potential(D, None)
    rng = np.random.default_rng(1)
    k = 8
    x0 = y.mean(0) + rng.standard_normal((k, D)) / np.sqrt(N)
    stretch = 1.0 if preconditioner == "none" else np.sqrt(N)
    run = simulate(pots, prior, sampler, x0, S.initial_velocity(sampler, rng, k, D),
                   process_time=(60.0 if workers < 16 else 30.0) * stretch,
                   delta=0.05 * stretch, seed=workers, refresh=1.0 / stretch,
                   burn_in=2.0 * stretch, preconditioner=preconditioner)
    ok, ess = _within_mcse(run.chains, y.mean(0), np.full(D, 1.0 / N))
    print(sampler, workers, "min ESS", ess.min())
    assert ok, ess
    assert np.min(ess) > 100  # the power check below needs MCSE < 0.125 sd
    assert not _within_mcse(run.chains, y.mean(0), np.full(D, 1.0 / N), shift=0.5)[0]
    assert run.winners[1:].sum() > 0 and (workers == 1 or np.all(run.winners[1:] > 0))


class _Loose(P.Potential):
    """A quadratic potential presented with bounds twice too large: every event goes through
    thinning (about half the candidates rejected), which must not change the target."""

    def __init__(self, inner: P.Quadratic):
        self.inner, self.dim = inner, inner.dim
        self.hess_bound = 2 * inner.hessian + np.eye(inner.dim)
        self.hess_abs = 2 * np.abs(inner.hessian) + 1.0

    def grad(self, x):
        return self.inner.grad(x)

    def value(self, x):
        return self.inner.value(x)

    def hess_quad(self, x, v):
        return self.inner.hess_quad(x, v)


@pytest.mark.parametrize("preconditioner", PC.KINDS)
@pytest.mark.parametrize("sampler", S.SAMPLERS)
@pytest.mark.parametrize("loose", [False, True])
def test_invariance_from_exact_draws(sampler, loose, preconditioner):
    """400 chains started from exact draws of (x, v) under a Gaussian prior (server events) and
    four workers; at process time 1 every coordinate passes a KS test against the exact
    marginal (Bonferroni over coordinates and the 16 cases of this test, family level 1e-3).
    Preconditioned, the exact draws of x map to exact draws of z, and the loose bounds are
    transformed by the generic rule (``|L|^T C |L|``, ``L^T B L``)."""
    d, prior_var = 3, 0.5
    rng = np.random.default_rng(7)
    y = 1.0 + rng.standard_normal((40, d))
    pots = [P.gaussian_mean_potential(part, 1.0) for part in np.array_split(y, 4)]
    if loose:
        pots = [_Loose(p) for p in pots]
    prior = P.gaussian_prior_potential(d, prior_var)
    prec = 1.0 / prior_var + len(y)
    mean, sd = y.sum(0) / prec, 1.0 / np.sqrt(prec)
    k = 400
    x0 = mean + sd * rng.standard_normal((k, d))
    v0 = S.initial_velocity(sampler, rng, k, d)
    # preconditioned: the posterior sd is 1 in z, so process time 1 / sd moves as far
    stretch = 1.0 if preconditioner == "none" else 1.0 / sd
    run = simulate(pots, prior, sampler, x0, v0, process_time=stretch, delta=stretch, seed=3,
                   refresh=1.0 / stretch, preconditioner=preconditioner)
    level = 1e-3 / (d * 16)
    for j in range(d):
        p = stats.kstest(run.x[:, j], stats.norm(mean[j], sd).cdf).pvalue
        assert p > level, (j, p)
    assert run.events.mean() > 3  # the chains did move through events


# ------------------------------------------------------------------ the bundle
GM = {"algorithm": "pdmc", "model": "gaussian-mean", "dataset": "synthetic",
      "synthetic-dim": 3, "synthetic-size": 60, "num-clients": 4, "partition": "iid",
      "prior-scale": 1.0}


def test_bundle_in_process_matches_the_exact_posterior(tmp_path):
    """Through the generic engine (4 workers, Gaussian prior): mean and variance within 4 MCSE
    of the conjugate posterior; ESS and R-hat in the diagnostics, chains kept apart on disk."""
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.models import exact_posterior

    result = run_in_process(parse_run_config({**GM, "output-dir": str(tmp_path),
                                              "pdmc.process-time": 40.0}), progress=False)
    assert result["outcome"] == "done"  # the stopping rule (every chain at T) ended it
    exp = build_experiment(parse_run_config({**GM, "output-dir": "unused"}))
    exact = exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None)
    mean, cov = G.to_moments(exact)
    saved = np.load(tmp_path / "posterior.npz")
    assert saved["chains"].shape[0] == 16 and saved["skeleton_time"].size > 0
    ok, ess = _within_mcse(saved["chains"], mean, np.diag(cov))
    assert ok, ess
    diag = result["history"][-1]["diagnostics"]
    assert {"ess_min", "rhat_max", "ess_per_grad_eval"} <= set(diag)
    assert diag["rhat_max"] < 1.05


def test_invalid_worker_replies_are_rejected_with_the_reason():
    exp = build_experiment(parse_run_config({**GM, "output-dir": "unused"}))
    state = exp.bundle.init_server(exp.setup)
    k, d = exp.setup.config.num_chains, 3
    good = Up(np.full(k, np.inf), np.ones((k, d)), 3, 1)
    assert judge(exp.bundle, exp.setup, exp.actions, state, 0, "train", good) is good
    for bad, field, needle in [
        (good._replace(tau=np.full(k, np.nan)), "tau", "non-finite"),
        (good._replace(tau=-np.ones(k)), "tau", "must be > 0"),
        (good._replace(velocity=np.ones((k, d + 1))), "velocity", "shape"),
        (good._replace(velocity=0.5 * np.ones((k, d))), "velocity", "+-1"),
    ]:
        got = judge(exp.bundle, exp.setup, exp.actions, state, 2, "train", bad)
        assert isinstance(got, Rejection) and got.field == field and needle in got.reason, got


def test_failing_worker_is_retried_then_the_run_stops_with_results_saved(tmp_path):
    """A NaN reply is retried with fresh randomness (the run goes on); with no retries left the
    run stops with the reason and the samples and skeleton so far are written. The worker is
    never dropped."""
    keys = {**GM, "pdmc.process-time": 5.0, "eval-every": 5, "inject-fault": "nan@3:2"}
    result = run_in_process(parse_run_config({**keys, "output-dir": str(tmp_path / "a")}),
                            progress=False)
    assert result["outcome"] == "done"
    assert sum(row.get("retried_replies", 0) for row in result["history"]) == 1
    stopped = run_in_process(parse_run_config({**keys, "max-retries": 0,
                                               "output-dir": str(tmp_path / "b")}),
                             progress=False)
    assert stopped["outcome"] == "stopped", stopped
    assert "partition 2" in stopped["reason"] and "tau" in stopped["reason"]
    saved = np.load(tmp_path / "b" / "posterior.npz")
    assert "skeleton_time" in saved and "chains" in saved


def test_models_without_rate_bounds_are_refused():
    from fedbayes_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match="PDMC needs rate bounds"):  # auto: metropolis
        parse_run_config({"algorithm": "pdmc", "model": "bnn-classifier", "pdmc.bounds": "exact"})
    with pytest.raises(ConfigError, match="pdmc.sampler"):
        parse_run_config({**GM, "pdmc.sampler": "hmc"})


def test_differential_privacy_refusals_and_report(tmp_path):
    """``pdmc.dp-epsilon``: refused for BPS, for a model with unbounded sensitivity and for a
    target out of reach; on logistic regression every worker adds rho and the run reports rho,
    the per-release guarantee and its composition over every released proposal."""
    from fedbayes_flwr.algorithms.pdmc import privacy
    from fedbayes_flwr.errors import ConfigError

    lr = {"algorithm": "pdmc", "model": "logistic-regression", "dataset": "synthetic",
          "synthetic-dim": 3, "synthetic-size": 100, "num-clients": 2, "partition": "iid",
          "pdmc.num-chains": 2, "pdmc.process-time": 0.5, "pdmc.dp-epsilon": 1.0,
          "pdmc.dp-delta": 1e-6}
    with pytest.raises(ConfigError, match="Zig-Zag sampler only"):
        parse_run_config({**lr, "algorithm": "pdmc-bps"})
    # the sensitivity and the reachable target need the parameter dimension: refused when the
    # experiment is built (before any client works), not by parse_run_config, which loads no data
    with pytest.raises(ConfigError, match="no finite rate sensitivity"):
        build_experiment(parse_run_config({**GM, "pdmc.dp-epsilon": 1.0, "pdmc.dp-delta": 1e-6}))
    with pytest.raises(ConfigError, match="out of reach"):
        build_experiment(parse_run_config({**lr, "pdmc.dp-delta": 0.0}))
    result = run_in_process(parse_run_config({**lr, "output-dir": str(tmp_path)}),
                            progress=False)
    row = result["history"][-1]
    sens = np.concatenate([np.full(3, 1.0), [1.0]])  # clip 1 per feature, 1 for the intercept
    rho = privacy.refresh_for_epsilon(1.0, sens, dim=None, horizon=1.0, delta=1e-6)
    assert row["dp_rho"] == pytest.approx(rho, rel=1e-12)
    assert row["dp_epsilon_per_release"] == pytest.approx(1.0, rel=1e-9)
    releases = row["round"] * 2  # every exchange releases one proposal per chain per worker
    assert row["dp_releases_per_worker"] == releases
    assert row["dp_epsilon_total"] == pytest.approx(releases * 1.0, rel=1e-9)
    assert row["grad_evals"] == row["grad_evals"] and row["switching_rate"] > 4 * rho


def test_the_wall_clock_cap_ends_as_time_limit_with_one_warning(tmp_path, capsys):
    """With no ``process-time``, ``pdmc.max-seconds`` becomes the run's cap: a run that reaches
    it before ``target-ess`` ends ``time-limit`` (not ``done``: the target was not met) and one
    warning line gives the ESS and R-hat reached (issue 32, row 13)."""
    config = parse_run_config({**GM, "pdmc.max-seconds": 1.0, "pdmc.target-ess": 1e9,
                               "eval-every": 20, "output-dir": str(tmp_path)})
    assert config.max_seconds == 1.0  # the section's cap is the run's
    result = run_in_process(config, progress=False)
    assert result["outcome"] == "time-limit", result["outcome"]
    lines = [x for x in capsys.readouterr().err.splitlines() if "time limit" in x]
    assert len(lines) == 1 and "min ESS" in lines[0] and "of 1e+09" in lines[0], lines
    assert "max R-hat" in lines[0]


# ------------------------------------------------------------------ the preconditioner (issue 33)
TINY_LR = {"model": "logistic-regression", "dataset": "synthetic", "synthetic-dim": 3,
           "synthetic-size": 100, "num-clients": 2, "partition": "iid", "pdmc.num-chains": 3,
           "pdmc.process-time": 1.0}


@pytest.mark.parametrize("algorithm", ["pdmc", "pdmc-bps"])
def test_no_preconditioner_is_bitwise_the_sampler_before_it(tmp_path, algorithm):
    """``pdmc.preconditioner = none``: the chains and skeleton are bit for bit those of the
    sampler before the preconditioner existed (recorded at commit be7a5cd with this config;
    tests/pdmc/data/none_before_preconditioning.npz)."""
    before = np.load("tests/pdmc/data/none_before_preconditioning.npz")
    run_in_process(parse_run_config({**TINY_LR, "algorithm": algorithm,
                                     "pdmc.preconditioner": "none",
                                     "output-dir": str(tmp_path)}), progress=False)
    saved = np.load(tmp_path / "posterior.npz")
    for key in ("chains", "skeleton_time", "skeleton_x", "skeleton_v"):
        np.testing.assert_array_equal(saved[key], before[f"{algorithm}.{key}"], err_msg=key)


def test_laplace_fit_finds_the_mode_and_the_inverse_hessian():
    """The federated Newton fit on a correlated logistic regression split over 3 workers: the
    total gradient at m is ~0 (Newton decrement < NEWTON_TOL), L L^T is the inverse Hessian
    there (dense), and the diagonal transform is its marginal sd."""
    rng = np.random.default_rng(0)
    cov = 0.8 * np.ones((4, 4)) + 0.2 * np.eye(4)
    x = np.c_[rng.multivariate_normal(np.zeros(4), cov, size=300), np.ones(300)]
    y = (rng.random(300) < 1 / (1 + np.exp(-x @ np.array([1.0, -0.5, 0.3, 0.0, 0.2])))) * 1.0
    pots = [P.Logistic(xs, ys) for xs, ys in zip(np.array_split(x, 3), np.array_split(y, 3),
                                                  strict=True)]
    prior = P.gaussian_prior_potential(5, 1.0)
    m, lower, fit = PC.laplace_fit([prior, *pots], np.zeros(5), "dense")
    h = prior.hessian + sum(p.hessian_at(m)[0] for p in pots)
    g = prior.grad(m[None])[0] + sum(p.grad(m[None])[0] for p in pots)
    assert 0.5 * g @ np.linalg.solve(h, g) < PC.NEWTON_TOL and fit.steps < 15
    np.testing.assert_allclose(lower @ lower.T, np.linalg.inv(h), rtol=1e-8, atol=1e-12)
    diag = PC.laplace_fit([prior, *pots], np.zeros(5), "diagonal")[1]
    np.testing.assert_allclose(diag, np.sqrt(np.diag(np.linalg.inv(h))), rtol=1e-8)
    # the polarisation Hessian every other potential gets agrees with the logistic closed form
    np.testing.assert_allclose(P.Potential.hessian_at(pots[0], m)[0], pots[0].hessian_at(m)[0],
                               rtol=1e-9, atol=1e-9)


def test_recentred_split_keeps_the_target_and_the_bounds():
    """Re-centring the workers at m and tilting the prior by the sum of their gradients there
    leaves the total gradient unchanged everywhere and every Hessian bound as it was."""
    rng = np.random.default_rng(1)
    pots = [P.Logistic(np.c_[rng.normal(size=(50, 2)), np.ones(50)], rng.random(50) < 0.5 * k)
            for k in (0.2, 1.0, 1.8)]  # label-skewed shares
    prior = P.gaussian_prior_potential(3, 1.0)
    m = rng.normal(size=3)
    total = prior.grad(m[None])[0] + sum(p.grad(m[None])[0] for p in pots)
    workers, tilted = PC.split_at_mode(pots, prior, m, total)
    at = rng.normal(size=(7, 3))
    np.testing.assert_allclose(tilted.grad(at) + sum(w.grad(at) for w in workers),
                               prior.grad(at) + sum(p.grad(at) for p in pots), atol=1e-10)
    for w, p in zip(workers, pots, strict=True):
        np.testing.assert_allclose(w.grad(m[None])[0], 0.0, atol=1e-12)
        assert w.hess_abs is p.hess_abs and w.hess_bound is p.hess_bound


def test_preconditioner_settings_and_refusals():
    from fedbayes_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match="pdmc.preconditioner: unknown preconditioner"):
        parse_run_config({**GM, "pdmc.preconditioner": "full"})
    lr = {**TINY_LR, "algorithm": "pdmc", "pdmc.dp-epsilon": 1.0, "pdmc.dp-delta": 1e-6}
    with pytest.raises(ConfigError, match="pdmc.preconditioner: 'dense' with dp-epsilon"):
        parse_run_config({**lr, "pdmc.preconditioner": "dense"})
    from fedbayes_flwr.algorithms.pdmc.bundle import preconditioner_kind

    assert preconditioner_kind(build_experiment(parse_run_config(
        {**lr, "output-dir": "unused"})).setup) == "none"  # auto: none with DP
    assert preconditioner_kind(build_experiment(parse_run_config(
        {**GM, "output-dir": "unused"})).setup) == "dense"
    assert PC.resolve("auto", PC.AUTO_DENSE_MAX + 1, private=False) == "diagonal"


@pytest.mark.parametrize("preconditioner", ["diagonal", "dense"])
def test_preconditioned_bundle_matches_the_exact_posterior(tmp_path, preconditioner):
    """The bundle with the federated Laplace fit (gaussian-mean, 4 workers, Gaussian prior):
    mean and variance within 4 MCSE of the conjugate posterior; the fit's exchanges are counted
    and the samples are in the model's coordinates."""
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.models import exact_posterior

    result = run_in_process(parse_run_config({
        **GM, "output-dir": str(tmp_path), "pdmc.process-time": 100.0,
        "pdmc.preconditioner": preconditioner}), progress=False)
    exp = build_experiment(parse_run_config({**GM, "output-dir": "unused"}))
    mean, cov = G.to_moments(exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None))
    saved = np.load(tmp_path / "posterior.npz")
    ok, ess = _within_mcse(saved["chains"], mean, np.diag(cov))
    assert ok, ess
    diag = result["history"][-1]["diagnostics"]
    assert diag["preconditioner"] == preconditioner and 1 <= diag["laplace_exchanges"] <= 3
    assert diag["exchanges"] == result["history"][-1]["round"]
