"""The AR(1) model with Student-t noise of Fed-PDMC (seed 003).

``ar1-student-t``
    ``Y_i = c + x Y_{i-1} + eps_i``, ``eps_i`` i.i.d. standard Student-t with :attr:`AR1StudentT.NU`
    ``= 3`` degrees of freedom and unit scale; ``theta = (c, x)`` (``param_dim = 2`` whatever the
    number of data columns). A data row is one trajectory ``(y_0, y_1, ..., y_K)`` (no ``y``,
    target ``"none"``), so a partition of the rows splits the ``N`` trajectories over the workers
    (evenly for ``partition = iid``), as in the paper.

**The first value.** The paper puts a joint prior ``pi_0(x, c, y_0)`` constant in ``(x, c)`` given
``y_0``. Here ``y_0`` is observed (the row's first column) and the likelihood is conditional on it:
``p(y_1..y_K | y_0, c, x) = prod_i t_nu(y_i - c - x y_{i-1})``; ``pi_0(y_0)`` then does not depend
on ``(c, x)`` and drops out of the posterior. This keeps ``theta`` two-dimensional (no latent
``y_0`` per trajectory).

**Prior.** The registry's Gaussian ``N(0, prior_scale^2 I)`` by default; the paper's flat prior on
``(c, x)`` over ``R^2`` is ``pdmc.flat-prior = true`` (PDMC only; the posterior is proper once a
few steps are observed, each factor decaying like ``|r|^-(nu + 1)``).

**Choices not in the seed's text** (the paper's ``nu``, ``N``, trajectory length and true values
are not given there): ``nu = 3`` (fixed, :attr:`AR1StudentT.NU`; the registry passes no
degrees-of-freedom option and ``noise-scale`` is ignored: unit scale); the synthetic generator
``ar1-student-t`` (:mod:`fedbayes_flwr.data.synthetic`) draws trajectories with ``c = 0.5``,
``x = 0.7``; ``synthetic-size`` is ``N`` (train plus test trajectories) and ``synthetic-dim`` is
``K``, e.g. ``N = 100``, ``K = 20``.

**Predictive.** One step ahead: for each step ``i = 1..K`` of a test trajectory, ``y_i`` given
``y_{i-1}`` has mean ``E[c + x y_{i-1}]`` and variance ``Var[c + x y_{i-1}] + nu / (nu - 2)`` (the
Student-t's variance) under the posterior (:meth:`Posterior.linear_moments`);
:meth:`AR1StudentT.metrics` scores it against ``y_1..y_K`` with the regression metrics (RMSE, and
the NLL of the Gaussian with those moments).

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
the AR(1) example with Student-t noise ("robust inference") of its numerical section.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.evaluation.predictive import regression_metrics
from fedbayes_flwr.inference.student_t import StudentTAR1, student_t_log_norm
from fedbayes_flwr.models.base import Model, Prediction


class AR1StudentT(Model):
    """AR(1) with standard Student-t noise, ``theta = (c, x)``; rows are trajectories
    ``(y_0, ..., y_K)`` conditioned on ``y_0`` (module docstring)."""

    name = "ar1-student-t"
    target = "none"
    synthetic = "ar1-student-t"
    has_targets = False
    NU = 3.0
    """Degrees of freedom ``nu`` of the Student-t noise (unit scale)."""

    def param_dim(self, num_features: int) -> int:
        return 2

    def check_data(self, x) -> str | None:
        """A reason the rows cannot be trajectories, or None (at least ``y_0, y_1``: 2 columns)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] < 2:
            return (f"ar1-student-t needs one trajectory (y_0, ..., y_K), K >= 1, per row; got "
                    f"shape {x.shape}")
        return None

    def log_likelihood_rows_tf(self, theta, x, y=None):
        """``sum_{i=1..K} log t_nu(y_i - c - x y_{i-1})`` per trajectory, shape ``(S, n)``."""
        import tensorflow as tf

        nu = self.NU
        prev, nxt = x[None, :, :-1], x[None, :, 1:]  # (1, n, K)
        r = nxt - theta[:, 0, None, None] - theta[:, 1, None, None] * prev  # (S, n, K)
        k = tf.cast(tf.shape(x)[1] - 1, theta.dtype)
        return (-0.5 * (nu + 1.0) * tf.reduce_sum(tf.math.log1p(r * r / nu), axis=2)
                + k * student_t_log_norm(nu))

    def bounded_potential(self, x, y=None):
        """:class:`~fedbayes_flwr.inference.student_t.StudentTAR1` of the rows (affine rate bounds from
        ``|psi'| <= (nu + 1) / nu``)."""
        return StudentTAR1(x, self.NU)

    @staticmethod
    def _design(x: np.ndarray) -> np.ndarray:
        """``(n K, 2)`` rows ``(1, y_{i-1})`` of every step of every trajectory."""
        prev = np.asarray(x, dtype=np.float64)[:, :-1].reshape(-1)
        return np.stack([np.ones_like(prev), prev], axis=1)

    def predictive(self, posterior, x) -> Prediction:
        """One-step-ahead mean and variance of ``y_1..y_K`` given the previous values, ``(n, K)``
        each (module docstring)."""
        x = np.asarray(x, dtype=np.float64)
        n, k = x.shape[0], x.shape[1] - 1
        m, v = posterior.linear_moments(self._design(x))
        noise_var = self.NU / (self.NU - 2.0)
        return Prediction(mean=m.reshape(n, k), var=v.reshape(n, k) + noise_var)

    def metrics(self, posterior, x, y=None) -> tuple[dict[str, float], None]:
        """``test_rmse`` and ``test_nll`` of the one-step-ahead predictive against ``y_1..y_K``
        (the NLL of the Gaussian with the predictive's moments, summed over the ``K`` steps of a
        trajectory, averaged over trajectories)."""
        pred = self.predictive(posterior, x)
        return regression_metrics(pred.mean, pred.var, np.asarray(x, dtype=np.float64)[:, 1:]), None
