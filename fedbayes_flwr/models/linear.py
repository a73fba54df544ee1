"""Models linear in ``theta``: Gaussian mean, linear regression, logistic regression.

``gaussian-mean``
    ``x_i ~ N(theta, sigma^2 I)``, ``theta`` in ``R^d``; no ``y``.
``linear-regression``
    ``y_i ~ N(x_i . theta, sigma^2)``, no intercept (embedded data are standardised).
``logistic-regression``
    ``y_i ~ Bernoulli(sigmoid(x_i . w + b))``, ``theta = (w, b)`` with the intercept LAST.

All three have a deterministic ``expected_log_likelihood_tf`` in q's mean parameters (exact for the
two conjugate models, 64-point Gauss-Hermite quadrature on the activation for logistic regression)
and an ``expected_log_likelihood`` for the free energy. All use the prior ``N(0, prior_scale^2 I)``.
"""

from __future__ import annotations

import numpy as np

from ..gaussian import NaturalGaussian
from .base import Model, Prediction

_GH_POINTS, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(64)
_GH_WEIGHTS = _GH_WEIGHTS / np.sqrt(2.0 * np.pi)


def _log_sigmoid(a: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -a)


def _activation_moments_tf(m1, m2, features):
    """Mean and variance of ``features @ theta`` from mean parameters (full or diagonal)."""
    import tensorflow as tf

    mean = tf.linalg.matvec(features, m1)
    if len(m2.shape) == 2:
        cov = m2 - m1[:, None] * m1[None, :]
        var = tf.reduce_sum(tf.linalg.matmul(features, cov) * features, axis=1)
    else:
        var = tf.linalg.matvec(features**2, m2 - m1**2)
    return mean, var


class GaussianMean(Model):
    """Unknown mean of Gaussian observations with known noise scale (conjugate)."""

    name = "gaussian-mean"
    target = "none"
    synthetic = "gaussian-mean"
    deterministic_expectations = True
    conjugate = True
    has_targets = False

    def log_likelihood_rows_tf(self, theta, x, y=None):
        import tensorflow as tf

        s2 = self.noise_scale**2
        diff = x[None, :, :] - theta[:, None, :]
        d = tf.cast(tf.shape(x)[1], theta.dtype)
        return -0.5 * tf.reduce_sum(diff**2, axis=2) / s2 - 0.5 * d * np.log(2.0 * np.pi * s2)

    def likelihood_factor(self, x, y=None) -> NaturalGaussian:
        s2 = self.noise_scale**2
        n, d = x.shape
        return NaturalGaussian(x.sum(axis=0) / s2, -0.5 * (n / s2) * np.eye(d))

    def expected_log_likelihood(self, q, x, y=None) -> float:
        s2 = self.noise_scale**2
        n, d = x.shape
        sq = np.sum((x - q.mean()) ** 2) + n * np.sum(q.std() ** 2)  # trace of the covariance
        return float(-0.5 * sq / s2 - 0.5 * n * d * np.log(2.0 * np.pi * s2))

    def expected_log_likelihood_tf(self, m1, m2, x, y=None):
        """``E_q[log p(x | theta)]`` as a function of q's mean parameters ``(E theta, E theta theta^T)``
        (``E theta^2`` for a diagonal q): exact, differentiable (for natural gradients)."""
        import tensorflow as tf

        s2 = self.noise_scale**2
        n = tf.cast(tf.shape(x)[0], m1.dtype)
        second = tf.linalg.diag_part(m2) if len(m2.shape) == 2 else m2
        sq = (tf.reduce_sum(x**2) - 2.0 * tf.reduce_sum(tf.linalg.matvec(x, m1))
              + n * tf.reduce_sum(second))
        d = tf.cast(tf.shape(x)[1], m1.dtype)
        return -0.5 * sq / s2 - 0.5 * n * d * np.log(2.0 * np.pi * s2)

    def predictive(self, posterior, x) -> Prediction:
        n = x.shape[0]
        mean = np.broadcast_to(posterior.mean(), (n, posterior.dim))
        var = np.broadcast_to(posterior.std() ** 2 + self.noise_scale**2, (n, posterior.dim))
        return Prediction(mean=np.array(mean), var=np.array(var))


class LinearRegression(Model):
    """Bayesian linear regression with known noise scale (conjugate)."""

    name = "linear-regression"
    target = "real"
    synthetic = "linear"
    deterministic_expectations = True
    conjugate = True

    def log_likelihood_rows_tf(self, theta, x, y):
        import tensorflow as tf

        s2 = self.noise_scale**2
        resid = y[None, :] - tf.linalg.matmul(theta, x, transpose_b=True)
        return -0.5 * resid**2 / s2 - 0.5 * np.log(2.0 * np.pi * s2)

    def likelihood_factor(self, x, y) -> NaturalGaussian:
        s2 = self.noise_scale**2
        return NaturalGaussian(x.T @ y / s2, -0.5 * (x.T @ x) / s2)

    def expected_log_likelihood(self, q, x, y) -> float:
        s2 = self.noise_scale**2
        m, v = q.linear_moments(x)
        return float(np.sum(-0.5 * ((y - m) ** 2 + v) / s2 - 0.5 * np.log(2.0 * np.pi * s2)))

    def expected_log_likelihood_tf(self, m1, m2, x, y):
        """Exact ``E_q[log p(y | x, theta)]`` in q's mean parameters (see GaussianMean)."""
        import tensorflow as tf

        s2 = self.noise_scale**2
        m, v = _activation_moments_tf(m1, m2, x)
        return tf.reduce_sum(-0.5 * ((y - m) ** 2 + v) / s2 - 0.5 * np.log(2.0 * np.pi * s2))

    def predictive(self, posterior, x) -> Prediction:
        """``y* | x*`` has mean ``E[x* . theta]`` and variance ``Var[x* . theta] + sigma^2``."""
        m, v = posterior.linear_moments(x)
        return Prediction(mean=m, var=v + self.noise_scale**2)


class LogisticRegression(Model):
    """Bayesian logistic regression, intercept as the last coordinate of ``theta``."""

    name = "logistic-regression"
    target = "binary"
    synthetic = "logistic"
    deterministic_expectations = True
    task = "classification"

    def param_dim(self, num_features: int) -> int:
        return num_features + 1

    @staticmethod
    def _design(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)

    def log_likelihood_rows_tf(self, theta, x, y):
        import tensorflow as tf
        import tensorflow_probability as tfp

        logits = tf.linalg.matmul(theta[:, :-1], x, transpose_b=True) + theta[:, -1:]
        return tfp.distributions.Bernoulli(logits=logits, dtype=theta.dtype).log_prob(y[None, :])

    def expected_log_likelihood(self, q, x, y) -> float:
        """``E_q[log p(y | x, theta)]`` by Gauss-Hermite quadrature on each activation (exact in
        the limit for a Gaussian ``q``; uses ``q.linear_moments`` only)."""
        m, v = q.linear_moments(self._design(x))
        sign = 2.0 * np.asarray(y, dtype=np.float64) - 1.0
        a = m[:, None] + np.sqrt(v)[:, None] * _GH_POINTS[None, :]
        return float(np.sum(_log_sigmoid(sign[:, None] * a) @ _GH_WEIGHTS))

    def expected_log_likelihood_tf(self, m1, m2, x, y):
        """``E_q[log p(y | x, theta)]`` in q's mean parameters by 64-point Gauss-Hermite quadrature
        on each activation ``a_i ~ N(x_i . m, x_i^T S x_i)``: deterministic and differentiable."""
        import tensorflow as tf

        design = tf.concat([x, tf.ones([tf.shape(x)[0], 1], x.dtype)], axis=1)
        m, v = _activation_moments_tf(m1, m2, design)
        sign = 2.0 * y - 1.0
        a = m[:, None] + tf.sqrt(tf.maximum(v, 0.0))[:, None] * _GH_POINTS[None, :]
        return tf.reduce_sum(tf.linalg.matvec(tf.math.log_sigmoid(sign[:, None] * a), _GH_WEIGHTS))

    def predictive(self, posterior, x) -> Prediction:
        """``p(y* = 1 | x*)``: Gauss-Hermite quadrature on the Gaussian activation when the
        posterior is Gaussian (``posterior.gaussian``), else the mean of the sigmoid over
        ``posterior.draws()``."""
        design = self._design(x)
        if posterior.gaussian:
            m, v = posterior.linear_moments(design)
            a = m[:, None] + np.sqrt(v)[:, None] * _GH_POINTS[None, :]
            prob = np.exp(_log_sigmoid(a)) @ _GH_WEIGHTS
        else:
            prob = np.exp(_log_sigmoid(posterior.draws() @ design.T)).mean(axis=0)
        return Prediction(prob=np.clip(prob, 0.0, 1.0))
