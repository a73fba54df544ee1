"""Models linear in ``theta``: Gaussian mean, linear regression, logistic regression (with a
Gaussian prior or with a hyperprior).

``gaussian-mean``
    ``x_i ~ N(theta, sigma^2 I)``, ``theta`` in ``R^d``; no ``y``.
``linear-regression``
    ``y_i ~ N(x_i . theta, sigma^2)``, no intercept (embedded data are standardised).
``logistic-regression``
    ``y_i ~ Bernoulli(sigmoid(x_i . w + b))``, ``theta = (w, b)`` with the intercept LAST.

``logistic-hyperprior``
    ``y_i ~ Bernoulli(sigmoid(x_i . w))``, ``theta = (w, log xi)`` with no intercept, under the
    hierarchical prior ``w | xi ~ N(0, I / xi)``, ``xi ~ Gamma(1, rate 100)`` (DSVGD's Bayesian
    logistic regression).

The first three have a deterministic ``expected_log_likelihood_tf`` in q's mean parameters (exact
for the two conjugate models, 64-point Gauss-Hermite quadrature on the activation for logistic
regression) and an ``expected_log_likelihood`` for the free energy. They use the prior
``N(0, prior_scale^2 I)``; ``logistic-hyperprior`` has its own prior (``gaussian_prior = False``).
"""

from __future__ import annotations

from math import lgamma

import numpy as np

from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.potentials import (
    Logistic,
    gaussian_mean_potential,
    linear_regression_potential,
)
from fedbayes_flwr.inference.sensitivity import gaussian_mean_sensitivity, logistic_sensitivity
from fedbayes_flwr.models.base import Model, Prediction

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

    def bounded_potential(self, x, y=None):
        """``sum_n |x_n - theta|^2 / (2 noise^2)``: quadratic, exact rates."""

        return gaussian_mean_potential(x, self.noise_scale**2)

    def rate_sensitivity(self, feature_clip: float, param_dim: int):
        """Unbounded: one record changes the rate by ``|x_i - y_ni| / noise^2``."""

        return gaussian_mean_sensitivity()

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

    def bounded_potential(self, x, y):
        """``|y - x theta|^2 / (2 noise^2)``: quadratic, exact rates."""

        return linear_regression_potential(x, y, self.noise_scale**2)

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

    def bounded_potential(self, x, y):
        """The negative log-likelihood with the Zig-Zag logistic bounds (``(1/4) xi xi^T``)."""

        return Logistic(self._design(np.asarray(x, dtype=np.float64)), y)

    def rate_sensitivity(self, feature_clip: float, param_dim: int):
        """``K_i = clip`` per weight and 1 for the intercept (add/remove one record)."""

        return logistic_sensitivity(np.full(param_dim - 1, feature_clip), intercept=True)

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


class LogisticHyperprior(Model):
    """Bayesian logistic regression with a Gamma hyperprior on the weights' precision.

    ``theta = (w, log xi)``: ``d`` weights (no intercept) and, LAST, the log precision. The
    likelihood is ``y_i ~ Bernoulli(sigmoid(x_i . w))``; the model's own prior
    (``gaussian_prior = False``) is ``w | xi ~ N(0, I / xi)``, ``xi ~ Gamma(a, rate b)`` with
    ``a = 1``, ``b = 100`` (scale 0.01, ``E[xi] = 0.01``), written in ``log xi``:

    ``log p(theta) = sum_j log N(w_j | 0, 1 / xi) + log Gamma(xi | a, b) + log xi``,

    the last term the log-Jacobian of ``xi = exp(log xi)``. :meth:`prior` returns the base class's
    Gaussian ``N(0, prior_scale^2 I)`` over ``theta`` as a stand-in for Gaussian-family
    algorithms only.

    Notes
    -----
    The paper writes ``Gamma(xi | a, b)`` with ``a = 1``, ``b = 0.01``. The reference code draws
    the initial ``xi`` with ``numpy.random.gamma(a0, b0)`` (scale 0.01, as here) but its
    log-density gradient has ``- b0 xi`` (rate 0.01, ``E[xi] = 100``). This class follows the
    scale reading (rate :attr:`HYPER_RATE` ``= 100``); change :attr:`HYPER_RATE` for the other.

    References
    ----------
    Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein
    Variational Gradient Descent", Section 7 ("Bayesian logistic regression"), following Gershman,
    Hoffman & Blei (2012), "Nonparametric variational inference"; Liu & Wang (2016), Section 6.
    """

    name = "logistic-hyperprior"
    target = "binary"
    synthetic = "logistic"
    task = "classification"
    gaussian_prior = False
    HYPER_SHAPE = 1.0
    """Shape ``a`` of the Gamma hyperprior on the precision ``xi``."""
    HYPER_RATE = 100.0
    """Rate ``b`` of the Gamma hyperprior (scale ``1 / b = 0.01``)."""

    def param_dim(self, num_features: int) -> int:
        return num_features + 1

    def log_likelihood_rows_tf(self, theta, x, y):
        import tensorflow as tf
        import tensorflow_probability as tfp

        logits = tf.linalg.matmul(theta[:, :-1], x, transpose_b=True)
        return tfp.distributions.Bernoulli(logits=logits, dtype=theta.dtype).log_prob(y[None, :])

    def log_prior_tf(self, theta, prior=None):
        """``sum_j log N(w_j | 0, 1/xi) + log Gamma(xi | a, b) + log xi`` per row of ``theta``
        ``(S, d + 1)`` (the Gaussian ``prior`` argument is ignored)."""
        import tensorflow as tf

        theta = tf.convert_to_tensor(theta, tf.float64)
        w, log_xi = theta[:, :-1], theta[:, -1]
        xi = tf.exp(log_xi)
        d = tf.cast(tf.shape(w)[1], tf.float64)
        a, b = self.HYPER_SHAPE, self.HYPER_RATE
        log_w = 0.5 * d * (log_xi - np.log(2.0 * np.pi)) - 0.5 * xi * tf.reduce_sum(w**2, axis=1)
        log_gamma = a * np.log(b) - lgamma(a) + (a - 1.0) * log_xi - b * xi
        return log_w + log_gamma + log_xi

    def predictive(self, posterior, x) -> Prediction:
        """``p(y* = 1 | x*) = mean_s sigmoid(x* . w_s)`` over ``posterior.draws()`` (all particles
        of a :class:`~fedbayes_flwr.inference.posterior.SamplePosterior`; fixed-seed draws otherwise): the
        averaged predictive over particles."""
        w = np.asarray(posterior.draws(), dtype=np.float64)[:, :-1]
        prob = np.exp(_log_sigmoid(w @ np.asarray(x, dtype=np.float64).T)).mean(axis=0)
        return Prediction(prob=np.clip(prob, 0.0, 1.0))
