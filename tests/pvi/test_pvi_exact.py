"""Tier 2: PVI on conjugate models reaches the exact posterior (and the exact evidence).

With a conjugate model the local optimum is closed form, so synchronous PVI with damping 1 is
exact after one round, sequential PVI after one pass, and damped synchronous PVI moves every factor
a fraction rho of the way to its exact value: the natural-parameter error is multiplied by exactly
(1 - rho) per round.
"""

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from fedbayes_flwr import models
from fedbayes_flwr.algorithms import commit
from fedbayes_flwr.algorithms.pvi import messages as pvi_messages
from fedbayes_flwr.algorithms.pvi import server as pvi_server
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

CASES = [("gaussian-mean", "synthetic"), ("linear-regression", "synthetic"),
         ("linear-regression", "diabetes")]


def _experiment(model, dataset, **kw):
    keys = {"model": model, "dataset": dataset, "num-clients": 10, "partition": "dirichlet",
            "partition-alpha": 0.3, "damping": 1.0, "seed": 3, "synthetic-size": 300, **kw}
    return build_experiment(parse_run_config(keys))


def _exact(exp):
    return models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)


def _rel_errors(nat, exact):
    m, c = G.to_moments(nat)
    if nat.is_diag:
        c = np.diag(c)
    me, ce = G.to_moments(exact)
    return (np.linalg.norm(m - me) / np.linalg.norm(me), np.linalg.norm(c - ce) / np.linalg.norm(ce))


def _log_evidence(exp):
    """log p(y) in closed form: y ~ N(0, X Sigma0 X^T + s^2 I) (linear), x rows jointly Gaussian."""
    x, y, s2 = exp.dataset.x_train, exp.dataset.y_train, exp.model.noise_scale**2
    prior_cov = G.full_cov(exp.prior)
    if y is None:  # gaussian-mean: vec(x) ~ N(0, kron(11^T, Sigma0) + s^2 I)
        n, d = x.shape
        cov = np.kron(np.ones((n, n)), prior_cov) + s2 * np.eye(n * d)
        return multivariate_normal(np.zeros(n * d), cov).logpdf(x.reshape(-1))
    return multivariate_normal(np.zeros(len(y)), x @ prior_cov @ x.T + s2 * np.eye(len(y))).logpdf(y)


def test_split_is_non_iid():
    exp = _experiment("linear-regression", "synthetic")
    sizes = [len(p) for p in exp.partitions]
    means = [exp.dataset.y_train[p].mean() for p in exp.partitions]
    assert len(set(sizes)) > 1 and np.std(means) > 0.3  # clients see different target ranges


@pytest.mark.parametrize("model, dataset", CASES)
def test_synchronous_exact_after_one_round_with_exact_evidence(model, dataset):
    exp = _experiment(model, dataset)
    (_, state, log), = iterate_in_process(exp, num_rounds=1)
    err_mean, err_cov = _rel_errors(state.posterior, _exact(exp))
    assert err_mean <= 1e-5 and err_cov <= 1e-5
    # the free energy at the exact posterior equals log p(y) (the bound is tight)
    assert log.log_marginal_likelihood == pytest.approx(_log_evidence(exp), rel=1e-9)


@pytest.mark.parametrize("model, dataset", CASES)
def test_sequential_exact_after_one_pass(model, dataset):
    exp = _experiment(model, dataset, schedule="sequential")
    rounds = list(iterate_in_process(exp, num_rounds=exp.num_clients))
    visited = [c for _, _, log in rounds for c in log.clients]
    assert sorted(visited) == list(range(exp.num_clients))  # one pass = every client once
    for _, state, _ in rounds[:-1]:  # not exact before the pass ends
        assert _rel_errors(state.posterior, _exact(exp))[0] > 1e-5
    err_mean, err_cov = _rel_errors(rounds[-1][1].posterior, _exact(exp))
    assert err_mean <= 1e-5 and err_cov <= 1e-5


@pytest.mark.parametrize("rho", [0.5, 0.2])
def test_damped_synchronous_converges_geometrically(rho):
    exp = _experiment("linear-regression", "synthetic", damping=rho)
    exact = _exact(exp)
    scale = np.linalg.norm(exact.eta2 - exp.prior.eta2)
    errors = []
    rounds = int(np.ceil(np.log(1e-7) / np.log(1 - rho)))  # (1 - rho)^rounds <= 1e-7
    for _, state, _ in iterate_in_process(exp, num_rounds=rounds):
        errors.append(np.linalg.norm(state.posterior.eta2 - exact.eta2) / scale)
    ratios = np.array(errors[1:]) / np.array(errors[:-1])
    # t_k^(i) = (1 - (1 - rho)^i) * exact factor, so the error ratio is exactly 1 - rho
    np.testing.assert_allclose(ratios[:20], 1 - rho, rtol=1e-6)
    err_mean, err_cov = _rel_errors(state.posterior, exact)
    assert err_mean <= 1e-5 and err_cov <= 1e-5


def test_mean_field_gaussian_mean_is_exact():
    exp = _experiment("gaussian-mean", "synthetic", covariance="diag")
    (_, state, _), = iterate_in_process(exp, num_rounds=1)
    assert state.posterior.is_diag
    err_mean, err_cov = _rel_errors(state.posterior, _exact(exp))
    assert err_mean <= 1e-5 and err_cov <= 1e-5


def test_server_rejects_bad_delta_and_keeps_posterior():
    prior = G.from_moments(np.zeros(2), np.eye(2))
    state = pvi_server.init_server(prior, 2)
    good = pvi_messages.ClientMessage(G.make([1.0, 0.0], -0.5 * np.eye(2)), 3, 1)
    nan = pvi_messages.ClientMessage(G.make([np.nan, 0.0], np.zeros((2, 2))), 3, 1)
    negative = pvi_messages.ClientMessage(G.make([0.0, 0.0], np.eye(2)), 3, 2)  # precision 1 - 2 < 0
    new, info = pvi_server.server_step(state, [(1, nan), (0, good)])
    assert info.accepted == (0,) and info.rejected[0].field == "delta.eta1"
    np.testing.assert_array_equal(new.posterior.eta2, G.add(prior, good.delta).eta2)
    new2, info2 = pvi_server.server_step(new, [(1, negative)])
    assert info2.rejected[0].reason.startswith("update makes")
    np.testing.assert_array_equal(new2.posterior.eta2, new.posterior.eta2)
    assert list(new2.accepted_round) == [1, commit.NO_ROUND]
