"""A model written as one TensorFlow log-likelihood: :class:`LikelihoodModel`.

The user writes ``log_likelihood(theta, x, y)``: ``theta`` a 1-D float64 tensor of length
``param_dim``, ``x`` of shape ``(n, f)``, ``y`` of shape ``(n,)``, returning the ``(n,)`` per-row
log-likelihoods ``log p(y_i | theta, x_i)``. Everything else a family needs is derived by
TensorFlow's automatic differentiation, each in a ``tf.function`` traced once per input
signature (``reduce_retracing``):

* the batched log density and its gradient over parameter rows (:class:`~.base.Model`'s
  compiled functions over :meth:`LikelihoodModel.log_likelihood_rows_tf`, which maps the user's
  function over the rows of ``theta`` with ``tf.vectorized_map``);
* per-datum gradients (the Jacobian of the ``(n,)`` rows for one ``theta``);
* :meth:`LikelihoodModel.gradient_potential`: the rows' negative log-likelihood as numpy
  ``value``, ``grad`` and ``hess_quad`` (``v^T H v`` by forward-over-backward differentiation,
  a Hessian-vector product without the Hessian) over ``K`` parameter rows, so decentralized HMC
  accepts the model;
* :meth:`LikelihoodModel.bounded_potential` for PDMC, only when the user supplies the Hessian
  bounds (``rate_bound``): autodiff gives derivatives, not global bounds.

The prior is the base class's Gaussian ``N(0, prior_scale^2 I)``; PVI uses Monte-Carlo
expectations (``deterministic_expectations = False``). The predictive log density is the
log-mean-exp of ``log_likelihood`` over the posterior's draws; the optional ``predict(theta, x)``
adds point metrics (accuracy and calibration, RMSE).

References
----------
Baydin, Pearlmutter, Radul & Siskind (2018), "Automatic differentiation in machine learning: a
survey", JMLR 18(153), Section 3.1 (forward-over-reverse Hessian-vector products); Pearlmutter
(1994), "Fast exact multiplication by the Hessian"; Bierkens, Fearnhead & Roberts (2019),
Section 3.2 (the Hessian bounds ``B``, ``C`` that make Zig-Zag / BPS rates simulable).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedbayes_flwr.evaluation.predictive import (
    binary_classification_metrics,
    multiclass_classification_metrics,
    reliability_diagram,
)
from fedbayes_flwr.inference.potentials import Potential
from fedbayes_flwr.models.base import Model, Prediction, _data_tensors

TASKS = {"binary": ("binary", "classification", "logistic"),
         "multiclass": ("multiclass", "classification", "softmax"),
         "regression": ("real", "regression", "linear")}
"""``task -> (target, Model.task, synthetic generator)``."""


class LikelihoodPotential(Potential):
    """``U(theta) = -sum_i log p(y_i | theta, x_i)`` of one data set as a numpy potential over
    ``K`` parameter rows, from a :class:`LikelihoodModel`'s compiled autodiff functions.

    ``hess_bound`` and ``hess_abs`` are set only when the model has a ``rate_bound`` (PDMC);
    ``value``, ``grad`` and ``hess_quad`` always work (decentralized HMC)."""

    quadratic = False

    def __init__(self, model: LikelihoodModel, x, y, bounds=None):
        self.model = model
        self.x_t, self.y_t = _data_tensors(x, y)
        self.dim = model.param_dim(int(self.x_t.shape[1]))
        if bounds is not None:
            hess_bound, hess_abs = (np.asarray(b, dtype=np.float64) for b in bounds)
            for label, b in (("hess_bound", hess_bound), ("hess_abs", hess_abs)):
                if b.shape != (self.dim, self.dim) or not np.all(np.isfinite(b)):
                    raise ValueError(f"model {model.name!r}: rate_bound must return finite "
                                     f"(hess_bound, hess_abs) of shape ({self.dim}, {self.dim}); "
                                     f"{label} has shape {b.shape}")
            self.hess_bound, self.hess_abs = hess_bound, hess_abs

    def _rows(self, theta) -> np.ndarray:
        theta = np.asarray(theta, dtype=np.float64)
        if theta.ndim != 2 or theta.shape[1] != self.dim:
            raise ValueError(f"theta must have shape (K, {self.dim}), got {theta.shape}")
        return theta

    def value(self, x):
        import tensorflow as tf

        value, _ = self.model._potential_fn()(tf.constant(self._rows(x)), self.x_t, self.y_t)
        return value.numpy()

    def grad(self, x):
        import tensorflow as tf

        _, grad = self.model._potential_fn()(tf.constant(self._rows(x)), self.x_t, self.y_t)
        return grad.numpy()

    def value_and_grad(self, x) -> tuple[np.ndarray, np.ndarray]:
        """``U`` and ``grad U`` at each row of ``x (K, d)`` in one compiled call."""
        import tensorflow as tf

        value, grad = self.model._potential_fn()(tf.constant(self._rows(x)), self.x_t, self.y_t)
        return value.numpy(), grad.numpy()

    def hess_quad(self, x, v):
        import tensorflow as tf

        v = np.asarray(v, dtype=np.float64)
        theta = self._rows(x)
        if v.shape != theta.shape:
            raise ValueError(f"v must have shape {theta.shape}, got {v.shape}")
        return self.model._hess_quad_fn()(tf.constant(theta), tf.constant(v), self.x_t,
                                          self.y_t).numpy()


class LikelihoodModel(Model):
    """A model given by a TensorFlow log-likelihood; every derived quantity by autodiff.

    Parameters
    ----------
    log_likelihood : callable
        ``log_likelihood(theta, x, y) -> (n,)`` float64 tensor of per-row log-likelihoods;
        ``theta`` is a 1-D float64 tensor of length ``param_dim``, ``x`` ``(n, f)``, ``y``
        ``(n,)`` float64 (class labels as floats). It must be written in TensorFlow ops (it is
        traced and differentiated twice, for ``hess_quad``).
    param_dim : int or callable
        The length of ``theta``: an int, or a function of the number of features ``f``.
    task : {"binary", "multiclass", "regression"}
        What ``y`` holds; sets the model's ``target``, ``task`` and synthetic data generator.
    predict : callable, optional
        ``predict(theta, x) -> (n,)`` (``P(y = 1)`` for ``binary``, the mean of ``y`` for
        ``regression``) or ``(n, C)`` class probabilities (``multiclass``), in TensorFlow, for
        point metrics. Without it a binary model uses ``exp(log_likelihood(theta, x, 1))``; the
        others report the log predictive density only.
    name : str, default "likelihood-model"
        The registry name (:func:`~fedbayes_flwr.models.registry.register_model` sets it).
    rate_bound : callable, optional
        ``rate_bound(x, y) -> (hess_bound, hess_abs)``, two ``(P, P)`` arrays with
        ``v^T H(theta) v <= v^T hess_bound v`` and ``|H_jk(theta)| <= hess_abs_jk`` for every
        ``theta``, ``H`` the Hessian of the rows' negative log-likelihood: what PDMC needs to
        simulate its event times. Without it :meth:`bounded_potential` is ``None`` and PDMC
        refuses the model.

    Notes
    -----
    The log prior is the Gaussian :meth:`~.base.Model.prior` ``N(0, prior_scale^2 I)``; PVI's
    local free energy uses Monte-Carlo expectations (reparameterisation), as for the BNNs.

    References
    ----------
    Baydin et al. (2018), "Automatic differentiation in machine learning: a survey", Section 3.1;
    Ashman et al. (2022), "Partitioned Variational Inference", Section 3 (Monte-Carlo local free
    energies for non-conjugate likelihoods).
    """

    name = "likelihood-model"
    deterministic_expectations = False

    def __init__(self, log_likelihood: Callable, *, param_dim: int | Callable[[int], int],
                 task: str, predict: Callable | None = None, name: str = "likelihood-model",
                 rate_bound: Callable | None = None):
        super().__init__(1.0)
        if not callable(log_likelihood):
            raise ValueError(f"log_likelihood must be callable, got {type(log_likelihood).__name__}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        if not (callable(param_dim) or (isinstance(param_dim, int | np.integer)
                                        and not isinstance(param_dim, bool) and param_dim >= 1)):
            raise ValueError(f"param_dim must be a positive int or a function of the number of "
                             f"features, got {param_dim!r}")
        for label, fn in (("predict", predict), ("rate_bound", rate_bound)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{label} must be callable or None, got {type(fn).__name__}")
        self.log_likelihood_fn = log_likelihood
        self.predict_fn = predict
        self.rate_bound = rate_bound
        self._param_dim = param_dim
        self.name = str(name)
        self.likelihood_task = task
        self.target, self.task, self.synthetic = TASKS[task]

    def param_dim(self, num_features: int) -> int:
        if callable(self._param_dim):
            p = self._param_dim(int(num_features))
            if isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 1:
                raise ValueError(f"model {self.name!r}: param_dim({num_features}) must be a "
                                 f"positive int, got {p!r}")
            return int(p)
        return int(self._param_dim)

    # ---- the user's function over rows -------------------------------------------------------

    def _rows_of_one(self, theta, x, y):
        """The user's ``(n,)`` log-likelihoods at one ``theta`` (shape-checked when traced)."""
        import tensorflow as tf

        rows = tf.convert_to_tensor(self.log_likelihood_fn(theta, x, y), dtype=tf.float64)
        if rows.shape.rank is not None and rows.shape.rank != 1:
            raise ValueError(f"model {self.name!r}: log_likelihood must return shape (n,), got "
                             f"{rows.shape}")
        return rows

    def log_likelihood_rows_tf(self, theta, x, y):
        """``(S, n)``: the user's ``log_likelihood`` at each row of ``theta`` (``(S, P)``),
        vectorised over the rows with ``tf.vectorized_map`` (each row independent of the others,
        as the batched gradient needs)."""
        import tensorflow as tf

        theta = tf.convert_to_tensor(theta, tf.float64)
        return tf.vectorized_map(lambda t: self._rows_of_one(t, x, y), theta)

    def _rows_at(self, theta, x, y):
        """The user's rows at one ``theta`` directly (the base class's per-datum Jacobian)."""
        return self._rows_of_one(theta, x, y)

    # ---- numpy potentials (decentralized HMC, PDMC) ----------------------------------------

    def _potential_fn(self):
        """Compiled ``(U, grad U)`` over ``K`` rows, ``U = -sum_i log p(y_i | theta_k, x_i)``."""
        if "potential" not in self._compiled:
            import tensorflow as tf

            @tf.function(reduce_retracing=True)
            def potential(theta, x, y):
                with tf.GradientTape() as tape:
                    tape.watch(theta)
                    value = -self.log_likelihood_tf(theta, x, y)
                # dense: tf.vectorized_map over one row gathers it (an IndexedSlices gradient)
                return value, tf.convert_to_tensor(tape.gradient(
                    value, theta, unconnected_gradients=tf.UnconnectedGradients.ZERO))

            self._compiled["potential"] = potential
        return self._compiled["potential"]

    def _hess_quad_fn(self):
        """Compiled ``v_k^T H(theta_k) v_k`` over ``K`` rows: the forward-mode derivative of the
        reverse-mode gradient along ``v`` is ``H v`` (rows independent, so per row)."""
        if "hess_quad" not in self._compiled:
            import tensorflow as tf

            @tf.function(reduce_retracing=True)
            def hess_quad(theta, v, x, y):
                with tf.autodiff.ForwardAccumulator(theta, v) as acc:
                    with tf.GradientTape() as tape:
                        tape.watch(theta)
                        value = -self.log_likelihood_tf(theta, x, y)
                    grad = tf.convert_to_tensor(tape.gradient(
                        value, theta, unconnected_gradients=tf.UnconnectedGradients.ZERO))
                hv = acc.jvp(grad, unconnected_gradients=tf.UnconnectedGradients.ZERO)
                return tf.reduce_sum(v * hv, axis=1)

            self._compiled["hess_quad"] = hess_quad
        return self._compiled["hess_quad"]

    def gradient_potential(self, x, y):
        """The rows' negative log-likelihood as a :class:`LikelihoodPotential` (numpy ``value``,
        ``grad`` and exact ``hess_quad`` over ``(K, d)`` batches, by autodiff)."""
        return LikelihoodPotential(self, x, y)

    def bounded_potential(self, x, y):
        """The :class:`LikelihoodPotential` with the user's ``rate_bound(x, y)`` Hessian bounds
        (PDMC), or ``None`` without ``rate_bound``."""
        if self.rate_bound is None:
            return None
        return LikelihoodPotential(self, x, y, bounds=self.rate_bound(x, y))

    def has_bounded_potential(self) -> bool:
        return self.rate_bound is not None

    def has_gradient_potential(self) -> bool:
        return True

    # ---- predictive and metrics --------------------------------------------------------------

    def _point_fn(self):
        """``(S, n)`` or ``(S, n, C)``: ``predict`` at each draw (or, binary without
        ``predict``, ``exp log p(y = 1 | theta, x)``)."""
        if "point" not in self._compiled:
            import tensorflow as tf

            if self.predict_fn is not None:
                fn = self.predict_fn

                def one(t, x):
                    return tf.convert_to_tensor(fn(t, x), tf.float64)
            else:
                def one(t, x):
                    return tf.exp(self._rows_of_one(t, x, tf.ones([tf.shape(x)[0]], tf.float64)))

            @tf.function(reduce_retracing=True)
            def point(theta, x):
                return tf.vectorized_map(lambda t: one(t, x), theta)

            self._compiled["point"] = point
        return self._compiled["point"]

    def _has_point(self) -> bool:
        return self.predict_fn is not None or self.likelihood_task == "binary"

    def predictive(self, posterior, x) -> Prediction:
        """Point predictions averaged over ``posterior.draws()``: ``prob`` (``P(y = 1)`` or the
        class probabilities) for classification, ``mean`` for regression; an empty
        :class:`~.base.Prediction` for a non-binary model without ``predict``."""
        import tensorflow as tf

        if not self._has_point():
            return Prediction()
        draws = tf.constant(np.asarray(posterior.draws(), dtype=np.float64))
        out = self._point_fn()(draws, tf.constant(np.asarray(x, dtype=np.float64))).numpy()
        mean = out.mean(axis=0)
        if self.task == "classification":
            return Prediction(prob=np.clip(mean, 0.0, 1.0))
        return Prediction(mean=mean)

    def log_predictive_density(self, posterior, x, y) -> np.ndarray:
        """``log mean_s p(y_i | theta_s, x_i)`` over ``posterior.draws()``, shape ``(n,)``."""
        import tensorflow as tf

        draws = tf.constant(np.asarray(posterior.draws(), dtype=np.float64))
        x_t, y_t = _data_tensors(x, y)
        rows = self._rows_fn()(draws, x_t, y_t)
        s = tf.cast(tf.shape(rows)[0], tf.float64)
        return (tf.reduce_logsumexp(rows, axis=0) - tf.math.log(s)).numpy()

    def _rows_fn(self):
        if "rows" not in self._compiled:
            import tensorflow as tf

            self._compiled["rows"] = tf.function(self.log_likelihood_rows_tf,
                                                 reduce_retracing=True)
        return self._compiled["rows"]

    def metrics(self, posterior, x, y) -> tuple[dict[str, float], dict | None]:
        """``test_nll`` = minus the mean log predictive density (log-mean-exp of
        ``log_likelihood`` over the draws), plus point metrics when available: accuracy, ECE and
        Brier score (classification; with a reliability diagram) or RMSE (regression)."""
        nll = float(-np.mean(self.log_predictive_density(posterior, x, y)))
        if not self._has_point():
            return {"test_nll": nll}, None
        pred = self.predictive(posterior, x)
        if self.task == "regression":
            mean = np.asarray(pred.mean, dtype=np.float64).reshape(-1)
            rmse = float(np.sqrt(np.mean((np.asarray(y, dtype=np.float64) - mean) ** 2)))
            return {"test_rmse": rmse, "test_nll": nll}, None
        labels = np.asarray(y).astype(np.int64)
        prob = np.asarray(pred.prob, dtype=np.float64)
        if self.likelihood_task == "binary":
            out = binary_classification_metrics(prob, labels)
        else:
            prob = prob / prob.sum(axis=1, keepdims=True)
            out = multiclass_classification_metrics(prob, labels)
        out["test_nll"] = nll
        return out, reliability_diagram(prob, labels)
