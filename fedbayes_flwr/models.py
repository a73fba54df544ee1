"""Models as log-likelihoods over a parameter vector ``theta``.

Each model gives

* ``log_likelihood_tf(theta, x, y)``: TensorFlow, ``theta`` of shape ``(S, P)`` -> ``(S,)`` summed over
  the rows of ``x`` (used by Monte-Carlo VI),
* ``expected_log_likelihood(q, x, y)``: ``E_q[log p(y | theta, x)]`` for a Gaussian ``q``, exact for
  the conjugate models and by Gauss-Hermite quadrature on the 1-D activation for logistic regression
  (used for the free energy),
* ``likelihood_factor(x, y)``: the exact Gaussian likelihood factor of conjugate models (else ``None``),
* ``predictive(posterior, x)`` and ``metrics(posterior, x, y)``.

Models
------
``gaussian-mean``
    ``x_i ~ N(theta, sigma^2 I)``, ``theta`` in ``R^d``; no ``y``.
``linear-regression``
    ``y_i ~ N(x_i . theta, sigma^2)``, no intercept (embedded data are standardised).
``logistic-regression``
    ``y_i ~ Bernoulli(sigmoid(x_i . w + b))``, ``theta = (w, b)`` with the intercept LAST.

All models use the prior ``N(0, prior_scale^2 I)`` on every coordinate.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from . import gaussian as G
from .gaussian import NaturalGaussian
from .metrics import binary_classification_metrics, regression_metrics, reliability_diagram

MODELS = ("gaussian-mean", "linear-regression", "logistic-regression", "bnn-classifier",
          "bnn-regression")
FREE_ENERGY_SAMPLES = 64
FREE_ENERGY_SEED = np.array([1618, 33], dtype=np.int32)

_GH_POINTS, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(64)
_GH_WEIGHTS = _GH_WEIGHTS / np.sqrt(2.0 * np.pi)


def _log_sigmoid(a: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -a)


def _gaussian_marginal(q, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``features @ theta`` under a Gaussian posterior."""
    mean, cov = q.mean(), q.cov()
    return features @ mean, np.einsum("ij,jk,ik->i", features, cov, features)


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


class Prediction(NamedTuple):
    """Predictive output on test inputs: ``mean``/``var`` (regression) or ``prob`` (classification)."""

    mean: np.ndarray | None = None
    var: np.ndarray | None = None
    prob: np.ndarray | None = None


class Model:
    """Base class; see the module docstring."""

    name = ""
    conjugate = False
    has_targets = True
    task = "regression"
    mean_field_only = False

    def __init__(self, noise_scale: float = 1.0):
        if not noise_scale > 0:
            raise ValueError(f"noise-scale must be > 0, got {noise_scale}")
        self.noise_scale = float(noise_scale)

    def param_dim(self, num_features: int) -> int:
        return num_features

    def prior(self, num_features: int, prior_scale: float, diag: bool) -> NaturalGaussian:
        """The prior ``N(0, prior_scale^2 I)`` in natural parameters."""
        if not prior_scale > 0:
            raise ValueError(f"prior-scale must be > 0, got {prior_scale}")
        p = self.param_dim(num_features)
        var = np.full(p, prior_scale**2)
        return G.from_moments(np.zeros(p), var if diag else np.diag(var))

    def likelihood_factor(self, x, y) -> NaturalGaussian | None:
        return None

    def local_init(self, q: NaturalGaussian, num_features: int) -> NaturalGaussian:
        """Where a local optimisation starts (the broadcast posterior, for convex models)."""
        return q

    def expected_log_likelihood(self, q, x, y) -> float:
        """Monte-Carlo ``E_q[log p(y | theta)]`` from a fixed seed (models without a closed form)."""
        import tensorflow as tf

        theta = tf.constant(q.sample(FREE_ENERGY_SEED, FREE_ENERGY_SAMPLES))
        y_t = tf.zeros([x.shape[0]], tf.float64) if y is None else tf.constant(y, tf.float64)
        return float(tf.reduce_mean(self.log_likelihood_tf(theta, tf.constant(x), y_t)))

    def metrics(self, posterior, x, y) -> tuple[dict[str, float], dict | None]:
        """Test metrics and, for classifiers, reliability-diagram data."""
        pred = self.predictive(posterior, x)
        if self.task == "classification":
            return binary_classification_metrics(pred.prob, y), reliability_diagram(pred.prob, y)
        target = x if y is None else y
        return regression_metrics(pred.mean, pred.var, target), None


class GaussianMean(Model):
    """Unknown mean of Gaussian observations with known noise scale (conjugate)."""

    name = "gaussian-mean"
    conjugate = True
    has_targets = False

    def log_likelihood_tf(self, theta, x, y=None):
        import tensorflow as tf

        s2 = self.noise_scale**2
        diff = x[None, :, :] - theta[:, None, :]
        n_entries = tf.cast(tf.size(x), theta.dtype)
        return (-0.5 * tf.reduce_sum(diff**2, axis=[1, 2]) / s2
                - 0.5 * n_entries * np.log(2.0 * np.pi * s2))

    def likelihood_factor(self, x, y=None) -> NaturalGaussian:
        s2 = self.noise_scale**2
        n, d = x.shape
        return NaturalGaussian(x.sum(axis=0) / s2, -0.5 * (n / s2) * np.eye(d))

    def expected_log_likelihood(self, q, x, y=None) -> float:
        s2 = self.noise_scale**2
        mean, cov = q.mean(), q.cov()
        n, d = x.shape
        sq = np.sum((x - mean) ** 2) + n * np.trace(cov)
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
    conjugate = True

    def log_likelihood_tf(self, theta, x, y):
        import tensorflow as tf

        s2 = self.noise_scale**2
        resid = y[None, :] - tf.linalg.matmul(theta, x, transpose_b=True)
        n = tf.cast(tf.shape(y)[0], theta.dtype)
        return -0.5 * tf.reduce_sum(resid**2, axis=1) / s2 - 0.5 * n * np.log(2.0 * np.pi * s2)

    def likelihood_factor(self, x, y) -> NaturalGaussian:
        s2 = self.noise_scale**2
        return NaturalGaussian(x.T @ y / s2, -0.5 * (x.T @ x) / s2)

    def expected_log_likelihood(self, q, x, y) -> float:
        s2 = self.noise_scale**2
        m, v = _gaussian_marginal(q, x)
        return float(np.sum(-0.5 * ((y - m) ** 2 + v) / s2 - 0.5 * np.log(2.0 * np.pi * s2)))

    def expected_log_likelihood_tf(self, m1, m2, x, y):
        """Exact ``E_q[log p(y | x, theta)]`` in q's mean parameters (see GaussianMean)."""
        import tensorflow as tf

        s2 = self.noise_scale**2
        m, v = _activation_moments_tf(m1, m2, x)
        return tf.reduce_sum(-0.5 * ((y - m) ** 2 + v) / s2 - 0.5 * np.log(2.0 * np.pi * s2))

    def predictive(self, posterior, x) -> Prediction:
        if hasattr(posterior, "cov"):
            m, v = _gaussian_marginal(posterior, x)
        else:
            f = posterior.samples @ x.T
            m, v = f.mean(axis=0), f.var(axis=0)
        return Prediction(mean=m, var=v + self.noise_scale**2)


class LogisticRegression(Model):
    """Bayesian logistic regression, intercept as the last coordinate of ``theta``."""

    name = "logistic-regression"
    task = "classification"

    def param_dim(self, num_features: int) -> int:
        return num_features + 1

    @staticmethod
    def _design(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)

    def log_likelihood_tf(self, theta, x, y):
        import tensorflow as tf
        import tensorflow_probability as tfp

        logits = tf.linalg.matmul(theta[:, :-1], x, transpose_b=True) + theta[:, -1:]
        dist = tfp.distributions.Bernoulli(logits=logits, dtype=theta.dtype)
        return tf.reduce_sum(dist.log_prob(y[None, :]), axis=1)

    def expected_log_likelihood(self, q, x, y) -> float:
        m, v = _gaussian_marginal(q, self._design(x))
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
        design = self._design(x)
        if hasattr(posterior, "cov"):
            m, v = _gaussian_marginal(posterior, design)
            a = m[:, None] + np.sqrt(v)[:, None] * _GH_POINTS[None, :]
            prob = np.exp(_log_sigmoid(a)) @ _GH_WEIGHTS
        else:
            prob = np.exp(_log_sigmoid(posterior.samples @ design.T)).mean(axis=0)
        return Prediction(prob=np.clip(prob, 0.0, 1.0))


_REGISTRY = {m.name: m for m in (GaussianMean, LinearRegression, LogisticRegression)}


@functools.cache
def make_model(name: str, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
               num_outputs: int = 1) -> Model:
    """The model called ``name`` (see :data:`MODELS`); one shared instance per arguments, so the
    compiled local optimiser is traced once per model, not once per call.

    ``hidden`` (hidden-layer widths) and ``num_outputs`` (classes) apply to the BNN models only.
    """
    if name in ("bnn-classifier", "bnn-regression"):
        from .bnn import BNNClassifier, BNNRegression

        cls = BNNClassifier if name == "bnn-classifier" else BNNRegression
        return cls(noise_scale, tuple(hidden), num_outputs if name == "bnn-classifier" else 1)
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return _REGISTRY[name](noise_scale)


def exact_posterior(model: Model, prior: NaturalGaussian, x, y) -> NaturalGaussian:
    """Exact posterior of a conjugate model on the pooled data (full covariance)."""
    factor = model.likelihood_factor(x, y)
    if factor is None:
        raise ValueError(f"model {model.name!r} has no closed-form posterior")
    return G.add(G.like(factor, prior), factor)
