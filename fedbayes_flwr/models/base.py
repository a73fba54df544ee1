"""The :class:`Model` base class: a log-likelihood over a parameter vector ``theta``.

A model implements one TensorFlow method, :meth:`Model.log_likelihood_rows_tf` (the per-row
log-likelihood, ``theta`` of shape ``(S, P)`` -> ``(S, n)``), plus its predictive. Everything a
sampler or an optimiser needs is written once here on top of it:

* :meth:`Model.log_likelihood_tf`: the row sum, ``(S,)`` (Monte-Carlo VI),
* :meth:`Model.log_prior_tf`: the prior's log density at each row of ``theta`` (the Gaussian
  ``prior`` by default; models with a non-Gaussian prior override it),
* :meth:`Model.log_prior_and_grad`: that log prior and its gradient, compiled and batched,
* :meth:`Model.log_density_and_grad`: a compiled, batched ``data_scale * log p(y | theta) +
  log p(theta)`` and its gradient for ``S`` parameter vectors at once (particles, chains),
* :meth:`Model.per_datum_grads`: gradients of selected rows' log-likelihoods (SGLD, PDMC rate
  bounds), without building the full ``n x P`` array,
* :meth:`Model.metrics`: test metrics from the predictive.

Predictives use the posterior protocol of :mod:`fedbayes_flwr.inference.posterior` only.

Class attributes
----------------
``name``
    Registry name (see :data:`fedbayes_flwr.models.MODELS`).
``target``
    Kind of target: ``"none"`` (no ``y``), ``"real"``, ``"binary"`` or ``"multiclass"``.
``synthetic``
    Synthetic data generator matching the model: ``"gaussian-mean"``, ``"linear"``,
    ``"logistic"``, ``"softmax"``, ``"sine"``, ``"mixture-1d"`` or ``"ar1-student-t"``.
``deterministic_expectations``
    ``True`` when the model has an exact or quadrature ``expected_log_likelihood_tf(m1, m2, x, y)``
    in q's mean parameters (conjugate models, logistic regression), ``False`` otherwise.
``conjugate``, ``has_targets``, ``task``, ``mean_field_only``
    As before: closed-form factor, whether ``y`` exists, ``"regression"`` or
    ``"classification"``, whether only diagonal Gaussians are supported.
``gaussian_prior``
    ``True`` (default) when the model's prior is the Gaussian :meth:`Model.prior`
    ``N(0, prior_scale^2 I)``. ``False`` for models with a prior of their own (a uniform, a
    hyperprior), implemented by an overriding :meth:`Model.log_prior_tf`: the Gaussian of
    :meth:`Model.prior` is then only a stand-in, used by the Gaussian-family algorithms (PVI,
    global VI) that need a Gaussian prior, while :meth:`Model.log_prior_tf`,
    :meth:`Model.log_prior_and_grad` and :meth:`Model.log_density_and_grad` use the model's own
    prior (the Gaussian argument only switches the prior term on).
``support``
    ``None`` (default: unbounded), or a ``(low, high)`` pair of floats bounding every coordinate
    of ``theta``: the support of a bounded prior (e.g. a uniform). Particle methods project
    particles back into it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fedbayes_flwr.evaluation.predictive import (
    binary_classification_metrics,
    regression_metrics,
    reliability_diagram,
)
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.sensitivity import UnboundedSensitivityError

if TYPE_CHECKING:
    from fedbayes_flwr.inference.posterior import Posterior

TARGETS = ("none", "real", "binary", "multiclass")
SYNTHETIC = ("gaussian-mean", "linear", "logistic", "softmax", "sine", "mixture-1d",
             "ar1-student-t")
FREE_ENERGY_SAMPLES = 64
FREE_ENERGY_SEED = np.array([1618, 33], dtype=np.int32)


class Prediction(NamedTuple):
    """Predictive output on test inputs: ``mean``/``var`` (regression) or ``prob`` (classification)."""

    mean: np.ndarray | None = None
    var: np.ndarray | None = None
    prob: np.ndarray | None = None


def _data_tensors(x, y):
    """``x`` and ``y`` as float64 tensors; a missing ``y`` becomes a zeros placeholder."""
    import tensorflow as tf

    x_t = tf.convert_to_tensor(np.asarray(x, dtype=np.float64))
    if y is None:
        return x_t, tf.zeros([x_t.shape[0]], tf.float64)
    return x_t, tf.convert_to_tensor(np.asarray(y, dtype=np.float64))


class Model:
    """Base class of every model; see the module docstring.

    Parameters
    ----------
    noise_scale : float, default 1.0
        Known observation noise scale of the Gaussian likelihoods (ignored by classifiers).
    """

    name = ""
    target = "real"
    synthetic = ""
    deterministic_expectations = False
    conjugate = False
    has_targets = True
    task = "regression"
    mean_field_only = False
    gaussian_prior = True
    support: tuple[float, float] | None = None

    def __init__(self, noise_scale: float = 1.0):
        if not noise_scale > 0:
            raise ValueError(f"noise-scale must be > 0, got {noise_scale}")
        self.noise_scale = float(noise_scale)
        self._compiled: dict[str, object] = {}

    @classmethod
    def build(cls, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
              num_outputs: int = 1) -> Model:
        """Construct from the registry's common options (``hidden``/``num_outputs``: BNNs only)."""
        return cls(noise_scale)

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

    def bounded_potential(self, x, y):
        """The rows' negative log-likelihood as a :class:`fedbayes_flwr.inference.potentials.Potential`
        (numpy gradient and rate bounds for PDMC), or None when the model has none."""
        return None

    def has_bounded_potential(self) -> bool:
        """Whether :meth:`bounded_potential` is available (without building one): PDMC's check."""
        return type(self).bounded_potential is not Model.bounded_potential

    def gradient_potential(self, x, y):
        """The rows' negative log-likelihood for gradient-based samplers (decentralized HMC):
        an object with numpy ``value``, ``grad`` and ``hess_quad`` over a batch of parameter
        rows ``(K, d)``, or None. Defaults to :meth:`bounded_potential`; models with no rate bounds
        (softmax regression, BNNs) override this one only, so PDMC still refuses them."""
        return self.bounded_potential(x, y)

    def has_gradient_potential(self) -> bool:
        """Whether :meth:`gradient_potential` is available (without building one)."""
        cls = type(self)
        return (cls.gradient_potential is not Model.gradient_potential
                or cls.bounded_potential is not Model.bounded_potential)

    def rate_sensitivity(self, feature_clip: float, param_dim: int):
        """Per-coordinate bound ``K_i`` on how much one record (add/remove) changes a Zig-Zag
        rate, for PDMC's differential privacy; models without one raise
        :class:`fedbayes_flwr.inference.sensitivity.UnboundedSensitivityError`."""

        raise UnboundedSensitivityError(f"model {self.name!r} has no bounded rate sensitivity")

    def local_init(self, q: NaturalGaussian, num_features: int) -> NaturalGaussian:
        """Where a local optimisation starts (the broadcast posterior, for convex models)."""
        return q

    # ---- log densities (TensorFlow, float64) ------------------------------------------------

    def log_likelihood_rows_tf(self, theta, x, y):
        """Per-row log-likelihood ``log p(y_i | theta_s, x_i)``, shape ``(S, n)``.

        ``theta`` is ``(S, P)``; each row of ``theta`` must be evaluated independently of the
        others (the batched gradient relies on it). ``y`` is a float64 ``(n,)`` tensor (zeros for
        models without targets).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement log_likelihood_rows_tf")

    def log_likelihood_tf(self, theta, x, y=None):
        """``sum_i log p(y_i | theta_s, x_i)``, shape ``(S,)``."""
        import tensorflow as tf

        if y is None:
            y = tf.zeros([tf.shape(x)[0]], theta.dtype)
        return tf.reduce_sum(self.log_likelihood_rows_tf(theta, x, y), axis=1)

    def log_prior_tf(self, theta, prior):
        """Log prior density at each row of ``theta``: by default the Gaussian ``prior``.

        Models whose prior is not Gaussian (``gaussian_prior = False``) override this with their
        own prior, and may ignore ``prior`` (the Gaussian stand-in of :meth:`prior`). An
        override must be TensorFlow-traceable, evaluate each row of ``theta`` independently and
        return a finite or ``-inf`` value whose gradient is finite.

        Parameters
        ----------
        theta : tf.Tensor or numpy.ndarray
            ``(S, P)`` float64.
        prior : NaturalGaussian or tfp.distributions.Distribution or None
            A proper Gaussian over ``P`` parameters, or that Gaussian already built with
            :func:`fedbayes_flwr.inference.gaussian.to_tfp` (as the compiled functions pass it).
            ``None`` only for models with their own prior.

        Returns
        -------
        tf.Tensor
            ``(S,)`` float64.
        """
        if prior is None:
            raise ValueError(f"model {self.name!r} has a Gaussian prior: pass it")
        dist = prior if hasattr(prior, "log_prob") else G.to_tfp(prior)
        return dist.log_prob(theta)

    def _log_density_fn(self):
        if "log_density" not in self._compiled:
            import tensorflow as tf

            @tf.function(reduce_retracing=True)
            def log_density(theta, x, y, data_scale, prior_dist):
                with tf.GradientTape() as tape:
                    tape.watch(theta)
                    value = data_scale * self.log_likelihood_tf(theta, x, y)
                    if prior_dist is not None:
                        value = value + self.log_prior_tf(theta, prior_dist)
                # rows of theta are independent, so d(sum of values)/d theta is per-row; dense
                # (a gradient through a row gather, e.g. tf.vectorized_map over one row, is
                # IndexedSlices)
                return value, tf.convert_to_tensor(tape.gradient(
                    value, theta, unconnected_gradients=tf.UnconnectedGradients.ZERO))

            self._compiled["log_density"] = log_density
        return self._compiled["log_density"]

    def _log_prior_fn(self):
        if "log_prior" not in self._compiled:
            import tensorflow as tf

            @tf.function(reduce_retracing=True)
            def log_prior(theta, prior_dist):
                with tf.GradientTape() as tape:
                    tape.watch(theta)
                    value = self.log_prior_tf(theta, prior_dist)
                # a piecewise-constant prior (a uniform) does not depend on theta: zero gradient
                return value, tf.convert_to_tensor(tape.gradient(
                    value, theta, unconnected_gradients=tf.UnconnectedGradients.ZERO))

            self._compiled["log_prior"] = log_prior
        return self._compiled["log_prior"]

    def log_prior_and_grad(self, theta, prior: NaturalGaussian | None) -> tuple[np.ndarray, np.ndarray]:
        """The model's log prior density and its gradient for a batch of parameter vectors.

        Computes ``log p(theta_s)`` with :meth:`log_prior_tf` (the Gaussian ``prior`` for
        ``gaussian_prior`` models, the model's own prior otherwise) in a compiled
        ``tf.function``, traced once per model like :meth:`log_density_and_grad`.

        Parameters
        ----------
        theta : numpy.ndarray
            ``(S, P)`` parameter vectors; a ``(P,)`` vector is treated as ``S = 1`` and the result
            returned unbatched.
        prior : NaturalGaussian or None
            The Gaussian prior (diagonal or full). Models with their own prior
            (``gaussian_prior = False``) ignore it and accept ``None``.

        Returns
        -------
        values : numpy.ndarray
            ``(S,)`` (a scalar for a ``(P,)`` input); ``-inf`` outside a bounded prior's support.
        grads : numpy.ndarray
            ``(S, P)`` (``(P,)`` for a ``(P,)`` input), ``d log p(theta_s) / d theta_s``; always
            finite (zero where the prior is flat, e.g. a uniform).

        References
        ----------
        Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein
        Variational Gradient Descent", eq. (1): the prior ``p_0(theta)`` of the generalised
        posterior.
        """
        import tensorflow as tf

        if prior is None and self.gaussian_prior:
            raise ValueError(f"model {self.name!r} has a Gaussian prior: pass it")
        theta = np.asarray(theta, dtype=np.float64)
        single = theta.ndim == 1
        theta_t = tf.convert_to_tensor(np.atleast_2d(theta))
        prior_dist = None if prior is None else G.to_tfp(prior)
        value, grad = self._log_prior_fn()(theta_t, prior_dist)
        value, grad = value.numpy(), grad.numpy()
        return (value[0], grad[0]) if single else (value, grad)

    def log_density_and_grad(self, theta, x, y, prior: NaturalGaussian | None = None,
                             data_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """Unnormalised log posterior density and its gradient for a batch of parameter vectors.

        Computes ``f(theta_s) = data_scale * sum_i log p(y_i | theta_s, x_i) + log p(theta_s)``
        (the prior term only when ``prior`` is given) with a compiled ``tf.function``. The prior
        term is :meth:`log_prior_tf`: the Gaussian ``prior`` itself, or, for a model with its own
        prior (``gaussian_prior = False``), that prior (``prior`` then only switches it on).

        Parameters
        ----------
        theta : numpy.ndarray
            ``(S, P)`` parameter vectors (particles, chains); a ``(P,)`` vector is treated as
            ``S = 1``.
        x, y : numpy.ndarray
            Data; ``y`` may be ``None`` for models without targets.
        prior : NaturalGaussian, optional
            Gaussian prior (diagonal or full); see above for models with their own prior.
        data_scale : float, default 1.0
            Multiplies the log-likelihood (e.g. ``N / batch_size`` for mini-batches).

        Returns
        -------
        values : numpy.ndarray
            ``(S,)``.
        grads : numpy.ndarray
            ``(S, P)``, ``d f / d theta_s``.
        """
        import tensorflow as tf

        theta = np.asarray(theta, dtype=np.float64)
        single = theta.ndim == 1
        theta_t = tf.convert_to_tensor(np.atleast_2d(theta))
        x_t, y_t = _data_tensors(x, y)
        prior_dist = None if prior is None else G.to_tfp(prior)
        value, grad = self._log_density_fn()(theta_t, x_t, y_t,
                                             tf.constant(data_scale, tf.float64), prior_dist)
        value, grad = value.numpy(), grad.numpy()
        return (value[0], grad[0]) if single else (value, grad)

    def _rows_at(self, theta, x, y):
        """The ``(n,)`` per-row log-likelihoods at ONE parameter vector ``theta`` ``(P,)``."""
        return self.log_likelihood_rows_tf(theta[None, :], x, y)[0]

    def _per_datum_fn(self):
        if "per_datum" not in self._compiled:
            import tensorflow as tf

            @tf.function(reduce_retracing=True)
            def per_datum(theta, x, y):
                with tf.GradientTape() as tape:
                    tape.watch(theta)
                    rows = self._rows_at(theta, x, y)
                return tape.jacobian(rows, theta)

            self._compiled["per_datum"] = per_datum
        return self._compiled["per_datum"]

    def per_datum_grads(self, theta, x, y, idx) -> np.ndarray:
        """Gradients of the selected rows' log-likelihoods, ``d log p(y_i | theta, x_i) / d theta``.

        Only the rows ``idx`` are evaluated (a Jacobian of ``len(idx)`` outputs), so the
        ``n x P`` array is never built for a subset.

        Parameters
        ----------
        theta : numpy.ndarray
            ``(P,)`` one parameter vector.
        x, y : numpy.ndarray
            The full local data (``y`` may be ``None`` for models without targets).
        idx : array_like of int
            Row indices, ``(k,)``.

        Returns
        -------
        numpy.ndarray
            ``(k, P)``, row ``j`` the gradient for datum ``idx[j]``.
        """
        import tensorflow as tf

        theta = np.asarray(theta, dtype=np.float64)
        if theta.ndim != 1:
            raise ValueError(f"theta must have shape (P,), got {theta.shape}")
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return np.zeros((0, theta.shape[0]))
        x_sel = np.asarray(x)[idx]
        y_sel = None if y is None else np.asarray(y)[idx]
        x_t, y_t = _data_tensors(x_sel, y_sel)
        return self._per_datum_fn()(tf.convert_to_tensor(theta), x_t, y_t).numpy()

    # ---- expectations, predictive, metrics --------------------------------------------------

    def expected_log_likelihood(self, q: Posterior, x, y) -> float:
        """Monte-Carlo ``E_q[log p(y | theta)]`` from a fixed seed (models without a closed form)."""
        import tensorflow as tf

        if "mean_log_likelihood" not in self._compiled:  # compiled: a model that maps its rows
            # with tf.vectorized_map would otherwise re-trace the map at every eager call
            self._compiled["mean_log_likelihood"] = tf.function(
                lambda theta, x, y: tf.reduce_mean(self.log_likelihood_tf(theta, x, y)),
                reduce_retracing=True)
        theta = tf.constant(q.sample(FREE_ENERGY_SEED, FREE_ENERGY_SAMPLES))
        x_t, y_t = _data_tensors(x, y)
        return float(self._compiled["mean_log_likelihood"](theta, x_t, y_t))

    def predictive(self, posterior: Posterior, x) -> Prediction:
        """Posterior predictive on test inputs ``x``, from the posterior protocol only."""
        raise NotImplementedError(f"{type(self).__name__} must implement predictive")

    def metrics(self, posterior: Posterior, x, y) -> tuple[dict[str, float], dict | None]:
        """Test metrics and, for classifiers, reliability-diagram data."""
        pred = self.predictive(posterior, x)
        if self.task == "classification":
            return binary_classification_metrics(pred.prob, y), reliability_diagram(pred.prob, y)
        target = x if y is None else y
        return regression_metrics(pred.mean, pred.var, target), None
