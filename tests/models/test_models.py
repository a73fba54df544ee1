"""Every registered model: declared attributes, and the sampler-ready interface (log prior, batched
log density and gradient, per-datum gradients) checked against finite differences and scipy.

Parametrised over :data:`fedbayes_flwr.models.MODELS`, which is derived from the registry, so a
new model cannot escape these checks; the plugin models of :mod:`tests.helpers.user_models`
(:class:`~fedbayes_flwr.models.LikelihoodModel` instances) are registered before collection, so
they are checked here too."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy.stats import multivariate_normal

from fedbayes_flwr.data import load_dataset
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.models import SYNTHETIC, TARGETS, Model, make_model, model_spec
from fedbayes_flwr.models import registry as R
from tests.helpers import user_models  # noqa: F401  (registers the plugin models)

NUM_FEATURES = 3
EPS = np.finfo(np.float64).eps


# Models over NUM_FEATURES inputs; a network with a fixed input width (a KerasModel, e.g. the
# 64-input plugin tests/helpers/user_keras.py registers) is checked against the built-in BNN it
# equals, to 1e-10, in tests/models/test_keras_model.py.
GENERIC = tuple(m for m in R.MODELS if getattr(R.model_spec(m), "num_inputs", None) is None)


@pytest.fixture(scope="module", params=GENERIC)
def case(request):
    """``(model, x, y)`` on small synthetic data matching the model's target."""
    cls = model_spec(request.param)
    ds = load_dataset("synthetic", cls.target, synthetic=cls.synthetic, synthetic_size=30,
                      synthetic_dim=NUM_FEATURES, seed=1)
    num_outputs = int(ds.y_train.max()) + 1 if cls.target == "multiclass" else 1
    model = make_model(request.param, 0.8, (4,), num_outputs)
    return model, ds.x_train, ds.y_train


def _random_prior(p: int, diag: bool, seed: int):
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=p)
    if diag:
        return G.from_moments(mean, rng.uniform(0.5, 2.0, size=p))
    a = rng.normal(size=(p, p)) / np.sqrt(p)
    return G.from_moments(mean, a @ a.T + 0.5 * np.eye(p))


def _theta(model: Model, s: int, seed: int) -> np.ndarray:
    return 0.5 * np.random.default_rng(seed).normal(size=(s, model.param_dim(NUM_FEATURES)))


def _tensors(x, y):
    y_t = tf.zeros([x.shape[0]], tf.float64) if y is None else tf.constant(y, tf.float64)
    return tf.constant(x, tf.float64), y_t


@pytest.mark.parametrize("name", GENERIC)
def test_registry_and_declared_attributes(name):
    cls = model_spec(name)
    model = make_model(name)
    # a class for the built-ins, the model itself for a plugin's built model
    assert (type(model) is cls or model is cls) and cls.name == name == model.name
    assert make_model(name) is model  # cached: compiled functions are traced once per model
    assert cls.target in TARGETS and cls.synthetic in SYNTHETIC
    assert cls.has_targets == (cls.target != "none")
    assert (cls.task == "classification") == (cls.target in ("binary", "multiclass"))
    # vi.py picks the deterministic path by this method; the flag must agree with it
    assert cls.deterministic_expectations == callable(getattr(cls, "expected_log_likelihood_tf",
                                                              None))
    assert set(R._CLASSES) <= set(R.MODELS) == set(R.model_names(structured=False))


def test_unknown_model_is_rejected():
    with pytest.raises(ValueError, match="unknown model"):
        model_spec("no-such-model")
    with pytest.raises(ValueError, match="unknown model"):
        make_model("no-such-model")


def test_log_likelihood_is_the_sum_of_rows(case):
    model, x, y = case
    theta = tf.constant(_theta(model, 4, 0))
    x_t, y_t = _tensors(x, y)
    rows = model.log_likelihood_rows_tf(theta, x_t, y_t).numpy()
    assert rows.shape == (4, x.shape[0])
    total = model.log_likelihood_tf(theta, x_t, y_t).numpy()
    # same terms, only the summation order differs: rounding-level agreement
    np.testing.assert_allclose(total, rows.sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("diag", [True, False])
def test_log_prior_matches_scipy(case, diag):
    model, _, _ = case
    p = model.param_dim(NUM_FEATURES)
    prior = _random_prior(p, diag, seed=3)
    theta = _theta(model, 5, 4)
    got = model.log_prior_tf(tf.constant(theta), prior).numpy()
    if not model.gaussian_prior:
        # Adapted, not skipped: a model with a prior of its own (uniform, hyperprior) has no
        # Gaussian to compare with; its prior is checked against scipy in test_dsvgd_models.py.
        # Here: the Gaussian argument is only a stand-in, which its log prior ignores.
        np.testing.assert_array_equal(got, model.log_prior_tf(tf.constant(theta), None).numpy())
        return
    mean, cov = G.to_moments(prior)
    want = multivariate_normal(mean, np.diag(cov) if diag else cov).logpdf(theta)
    # two float64 implementations of the same density (Cholesky vs eigendecomposition)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_batched_log_density_and_gradient_match_finite_differences(case):
    model, x, y = case
    p = model.param_dim(NUM_FEATURES)
    prior = _random_prior(p, diag=False, seed=5)
    theta = _theta(model, 3, 6)
    data_scale = 2.5
    values, grads = model.log_density_and_grad(theta, x, y, prior=prior, data_scale=data_scale)
    assert values.shape == (3,) and grads.shape == (3, p)

    x_t, y_t = _tensors(x, y)
    want = (data_scale * model.log_likelihood_tf(tf.constant(theta), x_t, y_t)
            + model.log_prior_tf(tf.constant(theta), prior)).numpy()
    np.testing.assert_allclose(values, want, rtol=1e-12)  # same terms, rounding only

    # central differences, every coordinate of every vector, in ONE batched call
    h = 1e-6
    steps = h * np.eye(p)
    batch = np.concatenate([theta[:, None, :] + steps, theta[:, None, :] - steps], axis=1)
    f, _ = model.log_density_and_grad(batch.reshape(-1, p), x, y, prior=prior,
                                      data_scale=data_scale)
    f = f.reshape(3, 2 * p)
    fd = (f[:, :p] - f[:, p:]) / (2 * h)
    # Rounding error of a central difference is ~ eps * |f| / h (~ 1e-8 here); the truncation
    # error h^2 f''' / 6 is ~ 1e-12. rtol 1e-5 is the brief's bound; atol covers the rounding
    # for near-zero gradient components with a 10x margin.
    atol = 10 * EPS * np.max(np.abs(values)) / h
    np.testing.assert_allclose(grads, fd, rtol=1e-5, atol=atol)


def test_log_density_without_prior_is_the_likelihood(case):
    model, x, y = case
    theta = _theta(model, 2, 7)
    values, _ = model.log_density_and_grad(theta, x, y)
    x_t, y_t = _tensors(x, y)
    np.testing.assert_allclose(values, model.log_likelihood_tf(tf.constant(theta), x_t, y_t),
                               rtol=1e-12)  # same computation, compiled vs eager
    one_value, one_grad = model.log_density_and_grad(theta[0], x, y)  # a single (P,) vector
    assert np.shape(one_value) == () and one_grad.shape == (theta.shape[1],)
    np.testing.assert_allclose(one_value, values[0], rtol=1e-12)


def test_per_datum_gradients(case):
    model, x, y = case
    theta = _theta(model, 1, 8)[0]
    n = x.shape[0]
    per_datum = model.per_datum_grads(theta, x, y, np.arange(n))
    assert per_datum.shape == (n, theta.shape[0])
    _, full = model.log_density_and_grad(theta[None], x, y)
    # the likelihood gradient is the sum of the per-datum gradients: only summation order differs
    np.testing.assert_allclose(per_datum.sum(axis=0), full[0], rtol=1e-10,
                               atol=1e-10 * np.max(np.abs(full)))

    idx = np.array([5, 0, 17, 5])  # unsorted, with a repeat
    subset = model.per_datum_grads(theta, x, y, idx)
    # the same rows evaluated on a smaller batch: rounding-level agreement
    np.testing.assert_allclose(subset, per_datum[idx], rtol=1e-10,
                               atol=1e-12 * np.max(np.abs(per_datum)))
    assert model.per_datum_grads(theta, x, y, []).shape == (0, theta.shape[0])
