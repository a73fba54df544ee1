"""AMPS: the permutation searches, the merges without symmetry, the paper's mixture, rejections.

Acceptance items of the AMPS issue: (1) searches, (2) no symmetry, (3) the paper's mixture on a few
seeds (the 20-seed table is ``benchmarks/amps/amps_gmm.py``), (6) invalid clients are rejected and not
counted. Every client's components are relabelled at random before merging, so a naive merge is
never aligned by accident.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.algorithms.amps import merge as amps
from fedbayes_flwr.algorithms.amps.bundle import BUNDLE, Up
from fedbayes_flwr.algorithms.base import Rejection
from fedbayes_flwr.data.amps_sets import MIXTURE_MEANS, paper_mixture
from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference.vb.gaussian_vector import to_natural
from fedbayes_flwr.inference.vb.gmm import GMM
from fedbayes_flwr.models import exact_posterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.steps import judge

PAPER = GMM(3, 1, noise_var=0.09, prior_var=2.0, concentration=1.0)
GMM_RUN = {"algorithm": "amps", "model": "gmm", "dataset": "amps-mixture", "num-clients": 10,
           "partition": "iid", "noise-scale": 0.3, "prior-scale": 2**0.5}


def _local_fits(model, x, clients, rng, restarts=5):
    """Each client's posterior from its share of ``x``, components relabelled at random."""
    prior = model.prior()
    out = []
    for part in np.array_split(x, clients):
        fit = model.fit(part, prior, rng, restarts=restarts)
        out.append(expfam.permute(fit.params, rng.permutation(model.num_components),
                                  model.symmetric))
    return prior, out


# ------------------------------------------------------------------ (1) the searches
@pytest.mark.parametrize("search", amps.SEARCHES)
def test_planted_permutation_is_recovered_up_to_one_relabelling(search):
    """Four clients hold the same well-separated posterior under planted permutations: the
    search undoes them exactly (P_1 = I fixes the common relabelling)."""
    rng = np.random.default_rng(0)
    model = GMM(4, 2, noise_var=0.01, prior_var=25.0)
    centres = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]])
    x = paper_mixture(rng, 40, centres, np.full(4, 0.25), 0.01)
    prior = model.prior()
    base = model.fit(x, prior, rng, restarts=3).params
    planted = [np.arange(4)] + [rng.permutation(4) for _ in range(3)]
    # client i's component k is base component planted[i][k]; aligning maps it back
    posts = [expfam.permute(base, p, model.symmetric) for p in planted]
    found = amps.align(prior, posts, model.symmetric, search)
    for i, perm in enumerate(found.perms):
        np.testing.assert_array_equal(np.asarray(planted[i])[perm], np.arange(4))
    assert found.objective > found.naive_objective


def test_objective_never_below_naive_and_searches_reach_brute_force():
    """200 random instances (N = 4 clients, K = 3, the paper's mixture, fresh data): both
    searches satisfy J >= J(naive) always, and reach the brute-force optimum in >= 95% of them
    (the issue's criterion; both are local searches)."""
    rng = np.random.default_rng(1)
    hits = {s: 0 for s in amps.SEARCHES}
    trials = 200
    for _ in range(trials):
        prior, posts = _local_fits(PAPER, paper_mixture(rng, 12), 4, rng, restarts=1)
        best = amps.brute_force(prior, posts, PAPER.symmetric)
        assert best.evaluations == 6**3
        for search in amps.SEARCHES:
            found = amps.align(prior, posts, PAPER.symmetric, search)
            assert found.naive_objective == pytest.approx(
                amps.objective(prior, posts, None, PAPER.symmetric), rel=1e-12)
            assert found.objective >= found.naive_objective - 1e-9 * abs(found.naive_objective)
            assert found.objective <= best.objective + 1e-9 * abs(best.objective)
            hits[search] += found.objective >= best.objective - 1e-9 * abs(best.objective)
    assert min(hits.values()) >= 0.95 * trials, hits


def test_merge_is_the_papers_eq_3_and_symmetric_merge_commutes_with_relabelling():
    rng = np.random.default_rng(2)
    prior, posts = _local_fits(PAPER, paper_mixture(rng, 9), 3, rng, restarts=1)
    merged = amps.merge(prior, posts)
    np.testing.assert_allclose(merged.weights.alpha,
                               -2 * prior.weights.alpha + sum(p.weights.alpha for p in posts))
    np.testing.assert_allclose(merged.means.prec,
                               -2 * prior.means.prec + sum(p.means.prec for p in posts))
    perm = np.array([2, 0, 1])
    same = amps.objective(prior, posts, np.tile(perm, (3, 1)), PAPER.symmetric)
    assert same == pytest.approx(amps.objective(prior, posts, None, PAPER.symmetric), rel=1e-12)


def test_bad_inputs_name_what_is_wrong():
    prior = PAPER.prior()
    with pytest.raises(ValueError, match="unknown AMPS search"):
        amps.align(prior, [prior], PAPER.symmetric, "greedy")
    with pytest.raises(ValueError, match="at least one client"):
        amps.align(prior, [], PAPER.symmetric)
    with pytest.raises(ValueError, match="exceeds"):
        amps.brute_force(prior, [prior] * 9, PAPER.symmetric)


# ------------------------------------------------------------------ (2) no symmetry
def test_gaussian_example_and_linear_regression_equal_the_exact_posterior():
    """The paper's Gaussian example (mu = 1, prior variance 2, 10 agents x 10) and linear
    regression: amps = naive-merge, and both equal the pooled exact posterior to 1e-10."""
    for keys in ({"model": "gaussian-mean", "dataset": "amps-gaussian", "prior-scale": 2**0.5},
                 {"model": "linear-regression", "dataset": "diabetes"}):
        results = {}
        for name in ("amps", "naive-merge"):
            config = parse_run_config({"algorithm": name, "num-clients": 10, "partition": "iid",
                                       "output-dir": "unused", **keys})
            exp = build_experiment(config)
            *_, (_, state, _) = iterate_in_process(exp)
            results[name] = to_natural(state.posterior)
        x, y = exp.dataset.x_train, exp.dataset.y_train
        exact = exact_posterior(exp.model, exp.prior, x, y)
        for got in results.values():
            np.testing.assert_allclose(got.eta1, exact.eta1, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(got.eta2, exact.eta2, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(results["amps"].eta1, results["naive-merge"].eta1)


def test_logistic_merge_is_positive_definite_and_reported_against_global_vi(tmp_path):
    """Logistic regression on breast-cancer, 5 clients: the merged precision is positive
    definite and the merged natural parameters equal eq. 3 of the clients' local VI optima
    computed here with numpy (comment below). The gap to global VI is the benchmark's to report
    (the paper sets no target for it; this test no longer runs batch VB only to print it)."""
    run_in_process(parse_run_config({
        "algorithm": "amps", "model": "logistic-regression", "dataset": "breast-cancer",
        "num-clients": 5, "output-dir": str(tmp_path / "amps")}), progress=False)
    post = np.load(tmp_path / "amps" / "posterior.npz")
    prec = -2 * post["eta2"]
    assert np.linalg.eigvalsh(0.5 * (prec + prec.T)).min() > 0
    # The merge (eq. 3) of the clients' local VI optima, eta = sum_k eta_k - (K - 1) eta_0,
    # with each optimum computed here without the library for the objective the library
    # maximises: the 64-point Gauss-Hermite sum of E_q[log p(y | theta)] (its rule,
    # fedbayes_flwr.models.linear), differentiated exactly, minus KL(q || prior)
    # (tests.helpers.logistic_vi.quadrature_optimum: numpy fixed-point iterations to a relative
    # residual ~1e-16). Tolerance 1e-6 of the max-norm: the library's local solve
    # (inference.vi.solve_local, tol min(amps.tol, 1e-8)) stops at a natural-gradient residual
    # of 1e-8 in coordinates whitened at q, where the free energy's curvature is ~1, so each
    # client's eta is off by ~1e-8 relative per coordinate, ~sqrt(d) = 5.6e-8 in norm; summed
    # over K = 5 clients ~3e-7 < 1e-6 (measured 2.5e-9 / 1.8e-9). Power: the optimum of the
    # same integral's stationarity identities evaluated with the same 64-point rule
    # (logistic_vi.optimum: dE/dmu = E[f'], dE/dv = E[f''] / 2, exact only for the integral)
    # is 1.3e-3 / 6.7e-4 away, and removing K prior copies instead of K - 1 moves eta2 by 8e-2:
    # both fail the same bound (checked below).
    from tests.helpers import logistic_vi

    exp = build_experiment(parse_run_config({"algorithm": "amps", "model": "logistic-regression",
                                             "dataset": "breast-cancer", "num-clients": 5}))
    k = exp.num_clients
    eta1, eta2 = -(k - 1) * exp.prior.eta1, -(k - 1) * exp.prior.eta2
    price1, price2 = eta1.copy(), eta2.copy()
    for pid in range(k):
        data = exp.client_data(pid)
        local, residual = logistic_vi.quadrature_optimum(exp.prior, data.x, data.y, order=64)
        assert residual < 1e-12, residual
        eta1, eta2 = eta1 + local.eta1, eta2 + local.eta2
        other = logistic_vi.optimum(exp.prior, data.x, data.y, iterations=200, order=64)
        price1, price2 = price1 + other.eta1, price2 + other.eta2

    def off(got, want):
        return np.abs(got - want).max() / np.abs(want).max()

    print(f"logistic merge vs the independent 64-point merge: eta1 {off(post['eta1'], eta1):.1e},"
          f" eta2 {off(post['eta2'], eta2):.1e}")
    assert off(post["eta1"], eta1) < 1e-6 and off(post["eta2"], eta2) < 1e-6, \
        (off(post["eta1"], eta1), off(post["eta2"], eta2))
    assert off(post["eta1"], price1) > 1e-6 and off(post["eta2"], price2) > 1e-6  # power
    assert off(post["eta2"], eta2 - exp.prior.eta2) > 1e-6  # the miscounted prior is seen


# ------------------------------------------------------------------ (3) the paper's mixture
def test_papers_mixture_amps_beats_naive_and_tracks_batch_vb():
    """Four seeds of the paper's mixture (30 points, 10 agents x 3, labels permuted): the
    issue's per-seed targets (b) AMPS >= naive + 0.3 nats/point held out, and on these seeds the
    largest mean error <= 0.3 (AMPS) vs >= 1.0 (naive), AMPS within 0.15 nats/point of batch
    VB on average. The 20-seed medians are the benchmark's."""
    errors, gaps = {"amps": [], "naive": []}, []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        x, x_test = paper_mixture(rng, 30), paper_mixture(rng, 2000)
        prior, posts = _local_fits(PAPER, x, 10, rng)
        found = amps.align(prior, posts, PAPER.symmetric, "bipartite")
        merged = {"amps": amps.merge(prior, posts, found.perms, PAPER.symmetric),
                  "naive": amps.merge(prior, posts)}
        batch = PAPER.fit(x, prior, rng, restarts=5).params
        ll = {k: PAPER.heldout_loglik(v, x_test) for k, v in merged.items()}
        assert ll["amps"] >= ll["naive"] + 0.3, (seed, ll)
        for k, v in merged.items():
            errors[k].append(amps.matched_error(PAPER.component_means(v), MIXTURE_MEANS)[0].max())
        gaps.append(PAPER.heldout_loglik(batch, x_test) - ll["amps"])
    assert np.median(errors["amps"]) <= 0.3 and np.median(errors["naive"]) >= 1.0, errors
    assert np.mean(gaps) <= 0.15, gaps


def test_cli_run_writes_the_merged_posterior(tmp_path):
    result = run_in_process(parse_run_config({**GMM_RUN, "output-dir": str(tmp_path)}),
                            progress=False)
    row = result["history"][0]
    assert row["clients"] == list(range(10)) and row["objective"] >= row["naive_objective"]
    saved = np.load(tmp_path / "posterior.npz")
    assert saved["means.h"].shape == (3, 1) and saved["weights.alpha"].shape == (3,)
    # 30 points: the merged weights hold the prior's 3 pseudo-counts plus one per point
    assert saved["weights.alpha"].sum() == pytest.approx(33.0, rel=1e-12)
    assert result["final"]["heldout_loglik"] > -2.0


# ------------------------------------------------------------------ (6) invalid clients
def _gmm_setup():
    exp = build_experiment(parse_run_config({**GMM_RUN, "output-dir": "unused"}))
    state = exp.bundle.init_server(exp.setup)
    return exp, state


@pytest.mark.parametrize(("corrupt", "field", "needle"), [
    (lambda p: p._replace(weights=expfam.Weights(-p.weights.alpha)), "posterior",
     "weights: alpha must be > 0"),
    (lambda p: p._replace(means=p.means._replace(prec=-p.means.prec)), "posterior",
     "means: prec must be > 0"),
    (lambda p: p._replace(weights=expfam.Weights(p.weights.alpha - 0.5)), "posterior",
     "weights - prior: alpha must be >= 0"),
    (lambda p: p._replace(weights=expfam.Weights(p.weights.alpha[:2]),
                          means=expfam.Gaussian(p.means.h[:2], p.means.prec[:2])),
     "posterior.means.h", "shape (2, 1), expected (3, 1)"),
])
def test_invalid_client_posteriors_are_rejected_with_the_reason(corrupt, field, needle):
    exp, state = _gmm_setup()
    prior = state.prior
    good = Up(prior, 0.0, 1, 3, 1, 0.0)
    assert judge(BUNDLE, exp.setup, exp.actions, state, 0, "train", good) is good
    bad = judge(BUNDLE, exp.setup, exp.actions, state, 4, "train",
                good._replace(posterior=corrupt(prior)))
    assert isinstance(bad, Rejection) and bad.partition_id == 4
    assert bad.field == field and needle in bad.reason, bad


def test_rejected_client_is_excluded_and_not_counted(tmp_path):
    """A client sending a negative precision is rejected; the merge uses N = 9 accepted
    clients, equal to merging the nine good posteriors directly."""
    result = run_in_process(parse_run_config({
        **GMM_RUN, "inject-fault": "negative-precision@1:3", "output-dir": str(tmp_path)}),
        progress=False)
    row = result["history"][0]
    assert row["rejected_replies"] == 1 and 3 not in row["clients"] and len(row["clients"]) == 9
    assert "must be > 0" in row["rejections"][0]["reason"]
    saved = np.load(tmp_path / "posterior.npz")
    exp = build_experiment(parse_run_config({**GMM_RUN, "output-dir": "unused"}))
    # the weights hold prior + one pseudo-count per point of the nine accepted clients
    rows = sum(len(exp.partitions[p]) for p in row["clients"])
    assert saved["weights.alpha"].sum() == pytest.approx(3.0 + rows, rel=1e-12)


def test_structured_models_only_run_with_amps():
    from fedbayes_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match="run it with amps"):
        parse_run_config({**GMM_RUN, "algorithm": "pvi"})
    with pytest.raises(ConfigError, match="AMPS runs the structured models"):
        parse_run_config({"algorithm": "amps", "model": "bnn-classifier"})
    with pytest.raises(ConfigError, match="amps.search"):
        parse_run_config({**GMM_RUN, "amps.search": "greedy"})


def test_lda_rejects_data_that_are_not_counts():
    from fedbayes_flwr.data import DataError

    with pytest.raises(DataError, match="lda needs word counts"):
        build_experiment(parse_run_config({"algorithm": "amps", "model": "lda",
                                           "dataset": "synthetic", "output-dir": "unused"}))


def test_structured_posterior_interface():
    rng = np.random.default_rng(3)
    fit = PAPER.fit(paper_mixture(rng, 30), PAPER.prior(), rng, restarts=2)
    from fedbayes_flwr.inference.posterior import StructuredPosterior

    post = StructuredPosterior(fit.params, PAPER)
    assert post.dim == 6 and post.mean().shape == (6,) and post.std().shape == (6,)
    draws = post.sample(np.array([1, 2], np.int32), 4000)
    # 4000 independent draws: the mean is within 5 standard errors of the exact mean
    se = post.std() / np.sqrt(4000)
    assert np.all(np.abs(draws.mean(0) - post.mean()) < 5 * se + 1e-12)
    np.testing.assert_allclose(draws[:, 3:].sum(1), 1.0)
    with pytest.raises(ValueError, match="prec must be > 0"):
        StructuredPosterior(fit.params._replace(means=fit.params.means._replace(
            prec=-fit.params.means.prec)), PAPER)
