"""FedAvg baselines of the DSVGD paper: the aggregation rules, Flower's FedAvgM equivalence, the
size query, the MAP fixed point on a conjugate model, rejections and the CLI names."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.algorithms import fedavg as F
from fedbayes_flwr.algorithms.base import Rejection, Round, client_seed
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.steps import judge

LINEAR = {"model": "linear-regression", "dataset": "diabetes", "num-clients": 3,
          "partition": "iid", "local-steps": 20, "batch-size": 0}


def _experiment(**values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_experiment(parse_run_config({**LINEAR, **values}))


def _rnd(number):
    return Round(number, 0, np.zeros(2, np.int32), frozenset(), False)


def test_fedavg_round_is_the_size_weighted_mean_of_the_local_fits():
    exp = _experiment(algorithm="fedavg", **{"num-rounds": 1, "partition": "dirichlet"})
    setup, bundle = exp.setup, exp.bundle
    ((_, state, _),) = list(iterate_in_process(exp))
    start = bundle.init_server(setup).theta
    fits, sizes = [], []
    for pid in range(3):
        data = exp.client_data(pid)
        seed = client_seed(setup.run_seed, "fedavg", "train", 1, pid)
        fits.append(F.local_fit(seed, start, data, setup))
        sizes.append(data.x.shape[0])
    assert len(set(sizes)) > 1  # unequal partitions: the weights matter
    want = sum(n * f for n, f in zip(sizes, fits, strict=True)) / sum(sizes)
    np.testing.assert_allclose(state.theta, want, rtol=0, atol=1e-12)


def test_fedavg_paper_step_equals_flower_fedavgm_without_momentum():
    """theta <- (n_k / n) theta_k + (1 - n_k / n) theta is Flower's FedAvgM aggregate with
    server learning rate n_k / n and momentum 0 (on the same arrays)."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvgM

    from tests.helpers.flower_utils import task_identity

    rng = np.random.default_rng(0)
    theta, theta_k = rng.normal(size=5), rng.normal(size=5)
    n_k, n = 37, 120
    strategy = FedAvgM(server_learning_rate=n_k / n, server_momentum=0.0)
    strategy.current_arrays = ArrayRecord({"theta": Array(theta)})
    with task_identity():
        reply = Message(RecordDict({"arrays": ArrayRecord({"theta": Array(theta_k)}),
                                    "metrics": MetricRecord({"num-examples": n_k})}),
                        dst_node_id=1, message_type="train")
        arrays, _ = strategy.aggregate_train(1, [reply])
    flower = arrays["theta"].numpy()
    ours = F.fedavgm_step(theta, theta_k, n_k / n)
    np.testing.assert_allclose(ours, flower, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours, (n_k / n) * theta_k + (1 - n_k / n) * theta, atol=1e-12)


def test_fedavg_paper_asks_the_sizes_once_then_one_client_per_round():
    exp = _experiment(algorithm="fedavg-paper", **{"num-rounds": 4})
    rows = list(iterate_in_process(exp))
    assert [log.clients for _, _, log in rows] == [(0,), (1,), (2,), (0,)]
    state = rows[-1][1]
    assert list(state.sizes) == [exp.client_data(k).x.shape[0] for k in range(3)]
    # the first row carries the size query's exchange as well as round 1's
    assert rows[0][2].exchanges == 2 and rows[1][2].exchanges == 1


def test_fedavg_converges_to_the_weighted_mean_of_exact_local_optima():
    """Linear regression, full batch: client k's objective log p(D_k | theta) + log p0 / K is
    quadratic with the optimum theta_k* = (X_k' X_k / s^2 + P0 / K)^-1 X_k' y_k / s^2, which does
    not depend on the start, so FedAvg's fixed point is sum_k n_k theta_k* / n: not the MAP
    unless the local Hessians agree.

    The bound, 1e-3 posterior sd per coordinate, is an optimiser's convergence tolerance (Adam
    has no closed-form residual): measured 1.2e-4 sd after round 2 (1.66 sd after round 1, so
    one round would not pass). Power: the pooled posterior mean (the MAP), the natural wrong
    answer, is 0.095-0.33 sd away in every coordinate and fails the same bound (checked)."""
    exp = _experiment(algorithm="fedavg", **{"num-rounds": 2, "local-steps": 300,
                                             "learning-rate": 0.05})
    state = list(iterate_in_process(exp))[-1][1]
    s2 = exp.model.noise_scale ** 2
    p0 = G.precision(exp.prior)
    p0 = np.diag(p0) if p0.ndim == 1 else p0
    optima, sizes = [], []
    for pid in range(3):
        d = exp.client_data(pid)
        optima.append(np.linalg.solve(d.x.T @ d.x / s2 + p0 / 3, d.x.T @ d.y / s2))
        sizes.append(d.x.shape[0])
    want = np.average(optima, axis=0, weights=sizes)  # numpy, not the code under test
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)
    mean, cov = G.to_moments(exact)
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(state.theta - want) / sd < 1e-3), np.abs(state.theta - want) / sd
    assert np.all(np.abs(mean - want) / sd > 1e-3), np.abs(mean - want) / sd  # power: not the MAP


def test_bad_replies_are_rejected_and_theta_untouched():
    exp = _experiment(algorithm="fedavg")
    setup, bundle = exp.setup, exp.bundle
    state = bundle.init_server(setup)
    d = setup.prior.dim
    for reply, field in ((F.Up(np.zeros(d - 1), 10, 1), "theta"),
                         (F.Up(np.full(d, np.nan), 10, 1), "theta"),
                         (F.Up(np.zeros(d), 0, 1), "num_examples"),
                         (F.Up(np.zeros(d), 10, 7), "request_round")):
        verdict = judge(bundle, setup, exp.actions, state, 2, "train", reply)
        assert isinstance(verdict, Rejection) and verdict.field == field, verdict
        new, info = bundle.server_step(state, [(2, verdict)], setup, _rnd(1))
        np.testing.assert_array_equal(new.theta, state.theta)
        assert info.rejected == (verdict,)


@pytest.mark.parametrize("name", ["fedavg", "fedavg-paper"])
def test_names_run_and_save_a_point_estimate(tmp_path, name):
    result = run_in_process(parse_run_config({
        "algorithm": name, "model": "logistic-regression", "dataset": "breast-cancer",
        "num-clients": 2, "num-rounds": 2, "local-steps": 10,
        "output-dir": str(tmp_path)}), progress=False)
    assert result["outcome"] == "completed" and result["final"]["test_accuracy"] > 0.8
    with np.load(tmp_path / "posterior.npz") as post:
        assert post["samples"].shape == (1, 31)
