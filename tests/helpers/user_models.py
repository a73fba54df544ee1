"""Model plugins written as a user would: TensorFlow log-likelihoods only.

Loaded by the ``model-modules`` run-config key (``tests.helpers.user_models``), which the CLI,
both Flower apps and a resumed run import; importing it registers:

``user-probit``
    ``y_i ~ Bernoulli(Phi(x_i . w + b))``, ``theta = (w, b)`` (intercept last), with the Hessian
    bounds PDMC needs: the second derivative of ``-log Phi(s z)`` in ``z`` lies in ``(0, 1)``
    (Sampford 1953), so ``H <= Z^T Z`` and ``|H_jk| <= sum_i |z_ij z_ik|`` for the design ``Z``
    with its intercept column.
``user-poisson``
    ``y_i ~ Poisson(exp(x_i . w + b))`` (count data), no rate bound (its curvature is unbounded).

:func:`user_logistic` builds the logistic regression the tests compare with the built-in one;
the module registers one as ``user-logistic`` (:data:`LOGISTIC`), so that a run loads it through
``model-modules`` as it loads the others.

References
----------
Sampford (1953), "Some inequalities on Mill's ratio and related functions", Ann. Math. Statist.
24(1) (``0 < d^2/dz^2 [-log Phi(z)] < 1``); McCullagh & Nelder (1989), "Generalized Linear
Models", Chapter 6 (Poisson log-linear models).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from fedbayes_flwr.models import LikelihoodModel, register_model

__all__ = ["LOGISTIC", "PROBIT", "POISSON", "user_logistic", "probit_bound"]


_STD_NORMAL = tfp.distributions.Normal(np.float64(0.0), np.float64(1.0))


def _linear(theta, x):
    return tf.linalg.matvec(x, theta[:-1]) + theta[-1]


def logistic_log_likelihood(theta, x, y):
    return -tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=_linear(theta, x))


def probit_log_likelihood(theta, x, y):
    z = _linear(theta, x)
    return _STD_NORMAL.log_cdf((2.0 * y - 1.0) * z)


def probit_predict(theta, x):
    return _STD_NORMAL.cdf(_linear(theta, x))


def probit_bound(x, y):
    """``(Z^T Z, |Z|^T |Z|)`` for the design ``Z = [x, 1]`` (module docstring)."""
    z = np.concatenate([np.asarray(x, dtype=np.float64), np.ones((np.shape(x)[0], 1))], axis=1)
    return z.T @ z, np.abs(z).T @ np.abs(z)


def poisson_log_likelihood(theta, x, y):
    eta = _linear(theta, x)
    return y * eta - tf.exp(eta) - tf.math.lgamma(y + 1.0)


def poisson_predict(theta, x):
    return tf.exp(_linear(theta, x))


def user_logistic(name: str = "user-logistic") -> LikelihoodModel:
    """Logistic regression as a user writes it (not registered)."""
    return LikelihoodModel(logistic_log_likelihood, param_dim=lambda f: f + 1, task="binary",
                           name=name)


PROBIT = LikelihoodModel(probit_log_likelihood, param_dim=lambda f: f + 1, task="binary",
                         predict=probit_predict, name="user-probit", rate_bound=probit_bound)
POISSON = LikelihoodModel(poisson_log_likelihood, param_dim=lambda f: f + 1, task="regression",
                          predict=poisson_predict, name="user-poisson")

LOGISTIC = user_logistic()

register_model("user-logistic", LOGISTIC)
register_model("user-probit", PROBIT)
register_model("user-poisson", POISSON)
