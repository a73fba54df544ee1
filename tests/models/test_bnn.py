"""Bayesian neural networks: the likelihood is the network we think it is, and every PVI schedule
and global VI learn something on small synthetic data."""

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import log_softmax

from fedbayes_flwr.inference.posterior import GaussianPosterior
from fedbayes_flwr.models import BNNClassifier, BNNRegression, parse_hidden
from fedbayes_flwr.runtime.config import ConfigError, parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from tests.helpers.numpy_nets import numpy_forward


@pytest.mark.parametrize("hidden", [(), (4,), (5, 3)])
def test_classifier_log_likelihood_matches_numpy_network(hidden):
    rng = np.random.default_rng(0)
    model = BNNClassifier(1.0, hidden, 3)
    x, y = rng.normal(size=(7, 2)), rng.integers(0, 3, size=7)
    sizes = model.layer_sizes(2)
    theta = rng.normal(size=(4, model.param_dim(2)))
    got = model.log_likelihood_tf(tf.constant(theta), tf.constant(x), tf.constant(y, tf.float64))
    want = [log_softmax(numpy_forward(t, x, sizes), axis=1)[np.arange(7), y].sum() for t in theta]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)


def test_regression_log_likelihood_matches_numpy_network():
    rng = np.random.default_rng(1)
    model = BNNRegression(0.5, (4,))
    x, y = rng.normal(size=(6, 3)), rng.normal(size=6)
    theta = rng.normal(size=(2, model.param_dim(3)))
    got = model.log_likelihood_tf(tf.constant(theta), tf.constant(x), tf.constant(y))
    f = [numpy_forward(t, x, model.layer_sizes(3))[:, 0] for t in theta]
    want = [np.sum(-0.5 * ((y - fi) / 0.5) ** 2 - np.log(0.5 * np.sqrt(2 * np.pi))) for fi in f]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)


def test_hidden_layers_and_covariance_are_validated():
    assert parse_hidden("50, 20") == (50, 20) and parse_hidden("") == ()
    with pytest.raises(ConfigError, match="hidden-layers"):
        parse_run_config({"hidden-layers": "50,x"})
    with pytest.raises(ConfigError, match="mean-field"):
        parse_run_config({"model": "bnn-classifier", "covariance": "full"})


BNN = {"model": "bnn-classifier", "dataset": "synthetic", "synthetic-size": 300,
       "synthetic-dim": 2, "hidden-layers": "8", "num-clients": 3, "partition": "iid",
       "local-steps": 300, "learning-rate": 0.02, "batch-size": 32, "seed": 0}


# global-vi pools the shared settings' clients and fixes damping 1: its preset notice is expected
@pytest.mark.filterwarnings("ignore::fedbayes_flwr.runtime.config.PresetNotice")
@pytest.mark.parametrize("algorithm, schedule, rounds", [
    ("global-vi", "synchronous", 2), ("pvi", "synchronous", 3), ("pvi", "sequential", 6),
    ("pvi", "asynchronous", 6)])
def test_every_schedule_learns_a_bnn_classifier(algorithm, schedule, rounds):
    exp = build_experiment(parse_run_config({**BNN, "algorithm": algorithm, "schedule": schedule,
                                             "num-rounds": rounds, "damping": 0.5}))
    assert exp.prior.is_diag and exp.model.num_outputs == 3
    final = list(iterate_in_process(exp))[-1]
    assert not final[2].rejected
    ds = exp.dataset
    metrics, _ = exp.model.metrics(GaussianPosterior(final[1].posterior), ds.x_test, ds.y_test)
    prior_metrics, _ = exp.model.metrics(GaussianPosterior(exp.prior), ds.x_test, ds.y_test)
    # 3 balanced-ish classes: chance accuracy ~1/3 and the prior predictive NLL ~log 3
    assert metrics["test_accuracy"] > 0.6
    assert metrics["test_nll"] < prior_metrics["test_nll"] - 0.2
