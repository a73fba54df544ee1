"""The numpy softmax-network potential against the model's TensorFlow likelihood.

Value and gradient are the same function computed two ways in float64: they agree to rounding
(relative 1e-8 on the value, 1e-6 on the gradient, far above the ~1e-13 both reach). The exact
Hessian quadratic form is checked against TensorFlow's forward-over-backward Hessian-vector
product (same function, rounding only) and against a central difference of the gradient along
``v``, whose truncation error is ``O(h^2)`` times the third derivative (about 1e-9 relative at
``h = 1e-5``; a ReLU kink inside ``[-h, h]`` would break it, measure zero for random data).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.models import make_model
from fedbayes_flwr.models.nets_numpy import SoftmaxNetPotential

CASES = {"softmax": (), "hidden": (7,), "two-hidden": (6, 5)}


def _problem(hidden, seed=0, n=40, f=5, classes=4, k=3):
    rng = np.random.default_rng(seed)
    model = make_model("bnn-classifier", 1.0, hidden, classes)
    x = rng.standard_normal((n, f))
    y = rng.integers(0, classes, n)
    pot = model.gradient_potential(x, y)
    assert isinstance(pot, SoftmaxNetPotential) and pot.dim == model.param_dim(f)
    theta = rng.standard_normal((k, pot.dim)) * 0.7
    v = rng.standard_normal((k, pot.dim))
    return model, x, y, pot, theta, v


def _tf_value_grad_hvp(model, x, y, theta, v):
    import tensorflow as tf

    th = tf.constant(theta)
    vt = tf.constant(v)
    with tf.GradientTape() as outer:
        outer.watch(th)
        with tf.GradientTape() as inner:
            inner.watch(th)
            value = -tf.reduce_sum(model.log_likelihood_rows_tf(
                th, tf.constant(x), tf.constant(y.astype(np.float64))), axis=1)
        grad = inner.gradient(value, th)
        directional = tf.reduce_sum(grad * vt)
    hvp = outer.gradient(directional, th)
    return value.numpy(), grad.numpy(), np.sum(hvp.numpy() * v, axis=1)


@pytest.mark.parametrize("case", CASES)
def test_value_grad_and_hessian_match_tensorflow(case):
    model, x, y, pot, theta, v = _problem(CASES[case])
    value, grad, quad = _tf_value_grad_hvp(model, x, y, theta, v)
    np.testing.assert_allclose(pot.value(theta), value, rtol=1e-8)
    np.testing.assert_allclose(pot.grad(theta), grad, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(pot.hess_quad(theta, v), quad, rtol=1e-8)


@pytest.mark.parametrize("case", CASES)
def test_hess_quad_is_the_derivative_of_the_gradient(case):
    _, _, _, pot, theta, v = _problem(CASES[case], seed=1)
    h = 1e-5
    fd = np.sum((pot.grad(theta + h * v) - pot.grad(theta - h * v)) * v, axis=1) / (2 * h)
    np.testing.assert_allclose(pot.hess_quad(theta, v), fd, rtol=1e-6)


@pytest.mark.parametrize("case", ["softmax", "hidden"])
def test_gradient_is_the_derivative_of_the_value(case):
    """Central difference of U along v: error O(h^2) ~ 1e-10 relative at h = 1e-5."""
    _, _, _, pot, theta, v = _problem(CASES[case], seed=2)
    h = 1e-5
    fd = (pot.value(theta + h * v) - pot.value(theta - h * v)) / (2 * h)
    np.testing.assert_allclose(np.sum(pot.grad(theta) * v, axis=1), fd, rtol=1e-6)


def test_rows_are_independent_and_the_cache_is_keyed_on_theta():
    """Row k of a batch equals the potential at that row alone; a changed theta of the same
    shape is not served from the one-entry cache."""
    _, _, _, pot, theta, v = _problem((7,), seed=3)
    batch = pot.grad(theta)
    for k in range(theta.shape[0]):
        np.testing.assert_allclose(pot.grad(theta[k:k + 1])[0], batch[k], rtol=1e-12)
    moved = theta + 0.1 * v
    np.testing.assert_allclose(pot.value(moved), SoftmaxNetPotential(
        pot.x, pot.y, pot.sizes).value(moved), rtol=1e-14)


def test_bad_inputs_are_refused():
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="class labels"):
        SoftmaxNetPotential(x, [0, 1, 3], (2, 3))
    with pytest.raises(ValueError, match="features"):
        SoftmaxNetPotential(x, [0, 1, 2], (4, 3))
    pot = SoftmaxNetPotential(x, [0, 1, 2], (2, 3))
    with pytest.raises(ValueError, match="theta must have shape"):
        pot.value(np.zeros((2, 5)))


def test_diagonal_prior_equals_the_dense_quadratic():
    from fedbayes_flwr.inference.potentials import DiagonalGaussian, Quadratic

    rng = np.random.default_rng(4)
    prec, mean = rng.random(6) + 0.1, rng.standard_normal(6)
    theta, v = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    diag, dense = DiagonalGaussian(prec, mean), Quadratic(np.diag(prec), mean)
    for name in ("value", "grad"):
        np.testing.assert_allclose(getattr(diag, name)(theta), getattr(dense, name)(theta),
                                   rtol=1e-12)
    np.testing.assert_allclose(diag.hess_quad(theta, v), dense.hess_quad(theta, v), rtol=1e-12)
    assert DiagonalGaussian(2.0, dim=6).value(theta).shape == (3,)
