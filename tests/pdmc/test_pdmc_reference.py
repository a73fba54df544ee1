"""Fed Zig-Zag against a NUTS reference: marginal W1 within a bound calibrated by the W1 of as
many i.i.d. reference draws as the run's ESS (logistic regression, N = 1000, d = 6, M = 4); the
reference module itself (NUTS on a conjugate model, the cache, the W1 and its noise floor).

The NUTS references are cached in pytest's cache folder (``.pytest_cache``), or under
``$FEDBAYES_CACHE`` when that is set, so only a first run pays for them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.stats import wasserstein_distance

from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.algorithms.pdmc.driver import simulate
from fedbayes_flwr.evaluation import reference as R
from fedbayes_flwr.evaluation import sample_quality as SQ
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference.posterior import SamplePosterior


@pytest.fixture
def cache_dir(request):
    if os.environ.get(R.CACHE_ENV) or getattr(request.config, "cache", None) is None:
        return None  # the user's cache (default_cache_dir)
    return str(request.config.cache.mkdir("fedbayes_reference"))


def test_marginal_w1_is_scipys_and_the_floor_replays_and_scales():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 200, 2)), 0.3 + rng.standard_normal((500, 2))
    w = SQ.marginal_w1(a, b)  # chains pooled
    flat = a.reshape(-1, 2)
    np.testing.assert_allclose(w, [wasserstein_distance(flat[:, j], b[:, j]) for j in range(2)])
    # the floor is scipy's W1 on the splits perm[:n] / perm[n:] of one permutation per repeat
    ref = rng.standard_normal((4000, 2)) * [1.0, 3.0]
    ref[:50, 0] = 0.25  # ties
    n = np.array([25, 900])
    floor = SQ.w1_noise_floor(ref, n, np.random.default_rng(5), repeats=6)
    replay = np.random.default_rng(5)
    for r in range(6):
        perm = replay.permutation(len(ref))
        for j in range(2):
            expected = wasserstein_distance(ref[perm[:n[j]], j], ref[perm[n[j]:], j])
            assert floor[r, j] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # W1 of n i.i.d. draws falls as n^{-1/2}: 4x the draws, half the distance (+-15%), and it
    # scales with the coordinate's spread
    big = np.random.default_rng(1).standard_normal((20000, 1)) * [[2.0]]
    f100 = SQ.w1_noise_floor(big, 100, np.random.default_rng(2), 300).mean()
    f400 = SQ.w1_noise_floor(big, 400, np.random.default_rng(3), 300).mean()
    assert f100 / f400 == pytest.approx(2.0, rel=0.15)
    with pytest.raises(ValueError, match="below"):
        SQ.w1_noise_floor(ref, 4000, rng)


@pytest.mark.filterwarnings("ignore:NUTS reference:RuntimeWarning")  # the 10-draw run
def test_nuts_reference_matches_a_conjugate_posterior_and_is_cached(tmp_path, monkeypatch):
    """NUTS on the Gaussian-mean model (exact posterior known): mean within 4 MCSE and variance
    within 4 MCSE per coordinate; the second call reads the cache (same draws), another seed
    is another entry; FEDBAYES_CACHE moves the default folder."""
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.models import exact_posterior, make_model

    model = make_model("gaussian-mean")
    x = 0.7 + np.random.default_rng(4).standard_normal((20, 2))
    prior = model.prior(2, 1.0, True)
    mean, cov = G.to_moments(exact_posterior(model, prior, x, None))
    var = np.diag(cov)
    kw = {"num_chains": 2, "num_draws": 1000, "num_warmup": 300, "cache_dir": str(tmp_path),
          "jit_compile": False}
    ref = R.nuts_reference(model, x, None, prior, **kw)
    assert not ref.from_cache and ref.chains.shape == (2, 1000, 2)
    assert np.max(ref.rhat) < 1.02 and ref.info["divergences"] == 0
    ess = ref.ess
    sq = (ref.chains - ref.draws.mean(0)) ** 2
    ess_sq = SamplePosterior(sq).ess()
    assert np.all(np.abs(ref.draws.mean(0) - mean) <= 4 * np.sqrt(var / ess)), (ess, mean)
    assert np.all(np.abs(sq.reshape(-1, 2).mean(0) - var) <= 4 * np.sqrt(2) * var / np.sqrt(ess_sq))
    again = R.nuts_reference(model, x, None, prior, **kw)
    assert again.from_cache and again.path == ref.path
    np.testing.assert_array_equal(again.chains, ref.chains)
    other = R.nuts_reference(model, x, None, prior, **{**kw, "num_draws": 10, "num_warmup": 10,
                                                       "seed": 1})
    assert other.path != ref.path and len(os.listdir(tmp_path)) == 2
    monkeypatch.setenv(R.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert R.default_cache_dir() == str(tmp_path / "elsewhere" / "reference")


def test_fed_zigzag_logistic_marginal_w1_within_the_calibrated_bound(cache_dir):
    """The paper's logistic regression (N = 1000 training rows, 5 features + intercept = d 6,
    N(0, I) prior), Fed Zig-Zag at M = 4 (8 chains, T = 100, burn-in 10): each coordinate's W1
    to NUTS is within the bound; the same draws shifted by 0.25 posterior sd are not (power).

    The bound is derived, with no factor: the W1 between exact samples of the same size, i.e.
    between as many i.i.d. reference draws as the run's ESS (that coordinate's, chains pooled)
    and the rest of the reference, at its (1 - 0.01 / d) quantile over 2,000 random splits
    (Bonferroni over the d = 6 coordinates: a sampler whose marginals carry the mean's
    effective size fails it with probability at most 1%). It was 3x the 99th percentile,
    argued from "quantiles and tails mix more slowly than the mean": not a derivation, and
    not what this run shows (its W1 0.002-0.0035 is below half the floor itself, 0.007-0.016).
    Power: a 0.25 sd shift moves W1 to 0.022-0.035, above the bound in every coordinate (a W1 of
    0.011, the size issue 31's audit reports for a halved thinning bound, would exceed it in 4
    of 6; the mutant is not rerun here); the test checks the ESS is large enough for that.
    """
    from fedbayes_flwr.data import load_dataset
    from fedbayes_flwr.models import make_model

    data = load_dataset("synthetic", "binary", synthetic="logistic", seed=0,
                        synthetic_size=1250, synthetic_dim=5, test_fraction=0.2)
    x, y = data.x_train, data.y_train
    assert x.shape == (1000, 5)
    model = make_model("logistic-regression")
    ref = R.nuts_reference(model, x, y, model.prior(5, 1.0, True), num_chains=4,
                           num_draws=2000, num_warmup=1000, seed=0, cache_dir=cache_dir)
    assert np.max(ref.rhat) < 1.01 and np.min(ref.ess) > 2000

    workers = [model.bounded_potential(xs, ys)
               for xs, ys in zip(np.array_split(x, 4), np.array_split(y, 4), strict=True)]
    rng = np.random.default_rng(11)
    k, d = 8, 6
    run = simulate(workers, P.gaussian_prior_potential(d, 1.0), "zigzag",
                   rng.standard_normal((k, d)), S.initial_velocity("zigzag", rng, k, d),
                   process_time=100.0, delta=0.1, seed=4, burn_in=10.0)
    assert np.all(run.winners[1:] > 0)  # every worker's events count
    ess = SamplePosterior(run.chains).ess()
    w1 = SQ.marginal_w1(run.chains, ref.draws)
    # The bound: the (1 - 0.01 / 6) quantile (Bonferroni over the 6 coordinates: an exact
    # sampler with that effective size fails with probability at most 1%) of the W1 between
    # exact samples of the run's ESS and the rest of the reference, 2,000 repeats (about 3
    # above that quantile), no factor.
    bound = SQ.w1_bound(ref.draws, ess, np.random.default_rng(12), repeats=2000,
                       quantile=1 - 0.01 / d, factor=1.0)
    print("ESS", ess.round(), "\nW1", w1.round(4), "\nbound", bound.round(4))
    assert np.all(w1 <= bound), (w1, bound, ess)
    assert np.min(ess) > 300  # enough for the power check below
    shifted = run.chains + 0.25 * ref.draws.std(0)
    assert np.all(SQ.marginal_w1(shifted, ref.draws) > bound), SQ.marginal_w1(shifted, ref.draws)


def _correlated_skewed_case(path, n=1000, d=5, rho=0.8, clients=4, seed=3):
    """Logistic regression on ``d`` equicorrelated features (correlation ``rho``), ``clients``
    workers split by label (90 % of a worker's rows carry its label), as an npz with
    ``client_id`` (partition ``natural``): a smaller cousin of issue 33's held-out case."""
    rng = np.random.default_rng(seed)
    cov = rho * np.ones((d, d)) + (1 - rho) * np.eye(d)
    x = rng.multivariate_normal(np.zeros(d), cov, size=n + 200)
    w = rng.normal(0, 1, d) / np.sqrt(d) * 2.0
    y = (rng.random(n + 200) < 1 / (1 + np.exp(-(x @ w + 0.3)))).astype(np.int64)
    ids = np.empty(n, np.int64)
    for label in (0, 1):
        rows = np.flatnonzero(y[:n] == label)
        owners = np.arange(clients)[np.arange(clients) % 2 == label]
        others = np.setdiff1d(np.arange(clients), owners)
        major = rng.random(rows.size) < 0.9
        ids[rows[major]] = rng.choice(owners, size=int(major.sum()))
        ids[rows[~major]] = rng.choice(others, size=int((~major).sum()))
    np.savez(path, x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:], client_id=ids)
    return str(path)


@pytest.mark.slow
def test_default_pdmc_on_a_correlated_label_skewed_logistic_regression(tmp_path, cache_dir):
    """Issue 33's done-when on a case of our own (d = 5 features + intercept, correlation 0.8,
    n = 1000, 4 label-skewed workers): with every default (so the preconditioner, ``auto``)
    ``pdmc`` stops by its rule (min ESS 400 and R-hat <= 1.01) within its time cap, and every
    marginal's W1 to NUTS is within 0.1 posterior sd (the issue's target; at ESS >= 400 the W1
    of exact draws is about 0.8 / sqrt(400) = 0.04 sd, so 0.1 sd is 2.5 times that noise)."""
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process_with_posterior
    from fedbayes_flwr.runtime.experiment import build_experiment

    keys = {"model": "logistic-regression", "data": _correlated_skewed_case(tmp_path / "c.npz"),
            "partition": "natural", "num-clients": 4, "algorithm": "pdmc",
            "output-dir": str(tmp_path / "run")}
    exp = build_experiment(parse_run_config(keys))
    ref = R.nuts_reference(exp.model, exp.dataset.x_train, exp.dataset.y_train, exp.prior,
                           num_chains=4, num_draws=2000, num_warmup=1000, seed=0,
                           cache_dir=cache_dir)
    assert np.max(ref.rhat) < 1.01 and np.min(ref.ess) > 2000
    result, posterior = run_in_process_with_posterior(parse_run_config(keys), progress=False)
    assert result["outcome"] == "done", result["outcome"]  # not "time-limit"
    post = SamplePosterior(posterior.chains)
    assert np.min(post.ess()) >= 400 and np.max(post.rhat()) <= 1.01
    w1 = SQ.marginal_w1(posterior.chains, ref.draws) / ref.draws.std(0, ddof=1)
    assert np.max(w1) <= 0.1, w1
    assert result["history"][-1]["diagnostics"]["preconditioner"] == "dense"
