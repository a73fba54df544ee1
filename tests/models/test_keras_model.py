"""A user's Keras 3 network as a model (:class:`fedbayes_flwr.models.KerasModel`).

* The Keras MLP 64-32-10 of :mod:`tests.helpers.user_keras` has the parameter layout of the
  built-in ``bnn-classifier`` (``hidden-layers = '32'``), a hand-written TensorFlow MLP: the
  batched log density and gradient, per-datum gradients and decentralized HMC's potential
  (value, gradient, ``v^T H v``, against the built-in's numpy network) agree to 1e-10.
* With the built-in's starting weights, PVI on the Keras network follows the built-in's
  trajectory (same seeds: same posterior to float tolerance, same test accuracy), so the Keras
  model meets done-when 3's "built-in minus at most 0.03" at these settings by construction;
  the full comparison (5 clients, 5 rounds, the plugin's own weights) is
  ``benchmarks/models/keras_vs_bnn.py``.
* ``to_keras`` puts the posterior mean into a copy of the network: its ``predict`` gives the
  library's point accuracy at the mean.
* DSVGD, SGLD, FedAvg and DHMC run on it through ``model-modules``; PDMC refuses it in one line.
"""

from __future__ import annotations

import warnings

import keras  # a dependency (TensorFlow 2.21 requires Keras 3): a missing one must fail
import numpy as np
import pytest

from fedbayes_flwr.errors import ConfigError  # noqa: E402
from fedbayes_flwr.inference.posterior import SamplePosterior  # noqa: E402
from fedbayes_flwr.models import KerasModel  # noqa: E402
from fedbayes_flwr.models.bnn import INIT_SEED, BNNClassifier  # noqa: E402
from fedbayes_flwr.runtime.config import parse_run_config  # noqa: E402
from fedbayes_flwr.runtime.engine import run_in_process  # noqa: E402
from tests.helpers import user_keras as UK  # noqa: E402

PLUGIN = "tests.helpers.user_keras"


def _close(got, want):
    """Two float64 evaluations of the same expression (a different op order: vectorised
    per-row matmuls against a tiled batch matmul, TensorFlow against numpy): agreement to 1e-10
    relative to the largest entry (sums of ~1000 terms of size ~1 lose ~1e-13)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * max(1.0, np.max(np.abs(want))))


@pytest.fixture(scope="module")
def digits_small(tmp_path_factory):
    """A stratified 400-row slice of ``digits`` (320 train, 80 test) as an ``.npz`` file."""
    from fedbayes_flwr.data import load_dataset

    d = load_dataset("digits", "multiclass", seed=0)
    x, y = d.x_train[:400], d.y_train[:400]
    path = tmp_path_factory.mktemp("keras") / "digits400.npz"
    np.savez(path, x_train=x[:320], y_train=y[:320], x_test=x[320:], y_test=y[320:])
    return str(path), x, y


def test_the_keras_mlp_equals_the_builtin_bnn(digits_small):
    _, x, y = digits_small
    x, y = x[:150], y[:150]
    mine, builtin = UK.KERAS_MLP, BNNClassifier(1.0, (32,), 10)
    p = builtin.param_dim(64)
    assert mine.param_dim(64) == p == 64 * 32 + 32 + 32 * 10 + 10
    theta = 0.2 * np.random.default_rng(1).normal(size=(5, p))
    prior = builtin.prior(64, 1.5, diag=True)
    for kwargs in ({}, {"prior": prior, "data_scale": 3.0}):
        for got, want in zip(mine.log_density_and_grad(theta, x, y, **kwargs),
                             builtin.log_density_and_grad(theta, x, y, **kwargs), strict=True):
            _close(got, want)
    _close(mine.per_datum_grads(theta[0], x, y, [3, 17, 40]),
           builtin.per_datum_grads(theta[0], x, y, [3, 17, 40]))
    ours, numpy_net = mine.gradient_potential(x, y), builtin.gradient_potential(x, y)
    v = np.random.default_rng(2).normal(size=theta.shape)
    _close(ours.value(theta), numpy_net.value(theta))
    _close(ours.grad(theta), numpy_net.grad(theta))
    _close(ours.hess_quad(theta, v), numpy_net.hess_quad(theta, v))
    assert mine.has_gradient_potential() and not mine.has_bounded_potential()


def _small_net(**kwargs):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                             keras.layers.Dense(kwargs.get("width", 2))])


def test_bad_arguments_are_one_line_value_errors():
    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    sub = Sub()
    sub(np.zeros((1, 4)))
    inputs = [keras.Input((4,)), keras.Input((2,))]
    two_inputs = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Concatenate()(inputs)))
    cases = [
        (lambda: KerasModel("net", likelihood="categorical"), "takes a keras.Model"),
        (lambda: KerasModel(keras.Sequential([keras.layers.Dense(2)]), likelihood="categorical"),
         "is not built"),
        (lambda: KerasModel(sub, likelihood="categorical"), "subclassed Sub"),
        (lambda: KerasModel(two_inputs, likelihood="categorical"), "one input and one output"),
        (lambda: KerasModel(_small_net(), likelihood="poisson"), "likelihood must be one of"),
        (lambda: KerasModel(_small_net(width=1), likelihood="categorical"), "width >= 2"),
        (lambda: KerasModel(_small_net(width=2), likelihood="bernoulli"), "width 1"),
        (lambda: KerasModel(_small_net(width=1), likelihood="gaussian", noise_scale=0.0),
         "noise-scale"),
        (lambda: KerasModel(_small_net(), likelihood="categorical").param_dim(5), "takes 4 input"),
        (lambda: KerasModel(_small_net(), likelihood="categorical").check_classes(3),
         "3 classes, the Keras network has 2"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            make()
        assert "\n" not in str(err.value)


def test_a_dataset_with_more_classes_than_logits_is_refused(digits_small):
    """Through the experiment: ``digits`` has 10 classes, this network 2 logits."""
    from fedbayes_flwr.models import register_model

    register_model("test-keras-two-logits",
                   KerasModel(keras.Sequential([keras.Input((64,)), keras.layers.Dense(2)]),
                              likelihood="categorical"))
    with pytest.raises(ValueError, match="10 classes, the Keras network has 2 output logits"):
        run_in_process(parse_run_config({"model": "test-keras-two-logits",
                                         "data": digits_small[0], "num-rounds": 1}),
                       progress=False)


def test_frozen_and_batch_norm_layers_are_held_constant():
    """Non-trainable variables (a frozen layer, batch norm's moving statistics) are constants:
    ``theta`` holds the trainable weights only, and the network in inference mode equals the
    float32 Keras model's own ``predict`` to float32 precision (relative 1e-5: ~100 eps_32)."""
    frozen = keras.layers.Dense(5, activation="relu", name="frozen")
    net = keras.Sequential([keras.Input((4,)), frozen, keras.layers.BatchNormalization(),
                            keras.layers.Dropout(0.5), keras.layers.Dense(3)])
    frozen.trainable = False
    bn = net.layers[1]
    bn.moving_mean.assign(np.linspace(-0.2, 0.3, 5))
    bn.moving_variance.assign(np.linspace(0.5, 2.0, 5))
    model = KerasModel(net, likelihood="categorical")
    p = 2 * 5 + 5 * 3 + 3  # batch norm's gamma, beta and the last Dense
    assert model.param_dim(4) == p == model.initial_weights.size
    x = np.random.default_rng(3).normal(size=(7, 4)).astype(np.float32)
    got = model.to_keras(model.initial_weights).predict(x, verbose=0)
    want = net.predict(x, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    probs = model.predictive(SamplePosterior(model.initial_weights[None]), x).prob
    np.testing.assert_allclose(probs, keras.ops.softmax(want).numpy(), rtol=1e-5, atol=1e-6)


def test_a_functional_net_with_a_nested_sequential_and_image_input():
    """A functional net (8x8x1 input, fed the flat 64 columns, a skip connection, a nested
    Sequential) evaluates as its own float32 ``predict`` (relative 1e-5, as above); a gaussian
    likelihood's point prediction is the network's output."""
    inputs = keras.Input((8, 8, 1))
    flat = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(6, activation="relu")(flat)
    inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6, activation="tanh"),
                              keras.layers.LayerNormalization()])
    out = keras.layers.Dense(1)(keras.layers.Add()([h, inner(h)]))
    net = keras.Model(inputs, out)
    model = KerasModel(net, likelihood="gaussian", noise_scale=0.5)
    x = np.random.default_rng(4).normal(size=(5, 64))
    want = net.predict(x.reshape(5, 8, 8, 1).astype(np.float32), verbose=0)[:, 0]
    got = model.predictive(SamplePosterior(model.initial_weights[None]), x).mean
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ runs
PVI_SMALL = {"algorithm": "pvi", "num-clients": 2, "partition": "iid", "num-rounds": 2,
             "seed": 0, "pvi.covariance": "diag", "pvi.local-steps": 50, "pvi.mc-samples": 4,
             "hidden-layers": "32"}


def _bnn_start_net() -> keras.Model:
    """The Keras MLP holding the built-in BNN's starting mean (``BNN.local_init``: He normal
    from ``INIT_SEED``, zero biases), in float64 so that it holds that start exactly."""
    net = UK.mlp(dtype="float64")
    rng = np.random.default_rng(INIT_SEED)
    weights = []
    for fan_in, fan_out in ((64, 32), (32, 10)):
        weights += [rng.normal(0.0, np.sqrt(2.0 / fan_in), (fan_in, fan_out)), np.zeros(fan_out)]
    net.set_weights(weights)
    return net


def test_pvi_on_keras_follows_the_builtin_and_to_keras_serves_the_mean(tmp_path, digits_small):
    import fedbayes_flwr

    data = digits_small[0]
    mine = KerasModel(_bnn_start_net(), likelihood="categorical")
    runs = {}
    for label, model in (("keras", mine), ("builtin", "bnn-classifier")):
        runs[label] = fedbayes_flwr.fit({**PVI_SMALL, "model": model, "data": data,
                                         "output-dir": str(tmp_path / label)}, progress=False)
    # the same start, seeds and (to 1e-10, test above) log density and gradient: the same
    # trajectory up to float64 op-order rounding carried through 2 x 50 Adam steps; 1e-8 of
    # the posterior's scale bounds that and is far below any behavioural difference
    keras_post, builtin_post = runs["keras"].posterior, runs["builtin"].posterior
    scale = np.max(np.abs(builtin_post.mean()))
    np.testing.assert_allclose(keras_post.mean(), builtin_post.mean(), atol=1e-8 * scale)
    np.testing.assert_allclose(keras_post.std(), builtin_post.std(), rtol=1e-8)
    acc = {k: r.final["test_accuracy"] for k, r in runs.items()}
    assert acc["keras"] >= acc["builtin"] - 0.03, acc  # done-when 3's margin (holds with ~0)

    # serving: the posterior mean in a copy of the user's network
    with np.load(data) as d:
        x_test, y_test = d["x_test"], d["y_test"]
    served = mine.to_keras(keras_post)
    assert served is not mine._net
    np.testing.assert_array_equal(served.get_weights()[0].reshape(-1), keras_post.mean()[:64 * 32])
    point, _ = mine.metrics(SamplePosterior(keras_post.mean()[None]), x_test, y_test)
    logits = served.predict(x_test, verbose=0)
    assert np.mean(np.argmax(logits, axis=1) == y_test) == point["test_accuracy"]
    # and the weights the user gave are untouched
    assert not np.array_equal(mine._net.get_weights()[0], served.get_weights()[0])


FAMILIES = {  # a few steps of each: does it run on the Keras network, is the posterior finite
    "dsvgd": {"num-rounds": 2, "dsvgd.num-particles": 4, "dsvgd.local-iterations": 10,
              "dsvgd.distillation-iterations": 10},
    "sgld": {"num-rounds": 2, "sgld.num-chains": 2, "sgld.steps-per-round": 20,
             "sgld.step-scale": 1e-4},
    "fedavg": {"num-rounds": 2, "fedavg.local-steps": 20},
    # a round is one HMC iteration; a fixed number of them (dhmc.iterations)
    "dhmc": {"dhmc.num-chains": 2, "dhmc.warmup": 4, "dhmc.iterations": 6,
             "dhmc.mixing-rounds": 2, "dhmc.step-size": 1e-3},
}


@pytest.mark.parametrize("algorithm", list(FAMILIES))
def test_the_families_run_on_the_keras_plugin(tmp_path, digits_small, algorithm):
    keys = {"algorithm": algorithm, "model-modules": PLUGIN, "model": "user-keras-mlp",
            "data": digits_small[0], "num-clients": 2, "partition": "iid", "seed": 1,
            "output-dir": str(tmp_path / "run"), **FAMILIES[algorithm]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # presets fixing num-clients say so once
        result = run_in_process(parse_run_config(keys), progress=False)
    assert result["outcome"] == "completed", result.get("reason")
    assert all(row["rejected_replies"] == 0 for row in result["history"])
    assert np.isfinite(result["history"][-1]["test_nll"])
    with np.load(tmp_path / "run" / "posterior.npz") as post:
        arrays = {k: post[k] for k in post.files if post[k].dtype.kind == "f"}
    assert arrays and all(np.all(np.isfinite(a)) for a in arrays.values()), list(arrays)


def test_pdmc_refuses_the_keras_model_in_one_line():
    """With exact bounds (a Keras network supplies no rate bound): one line; with the default
    ``pdmc.bounds = auto`` the same config is accepted (the Metropolis-adjusted variant)."""
    parse_run_config({"algorithm": "pdmc", "model-modules": PLUGIN, "model": "user-keras-mlp"})
    with pytest.raises(ConfigError) as err:
        parse_run_config({"algorithm": "pdmc", "model-modules": PLUGIN,
                          "model": "user-keras-mlp", "pdmc.bounds": "exact"})
    assert "rate_bound" in str(err.value) and "\n" not in str(err.value)
