"""Synthetic datasets generated from a seed.

Each generator draws ``size`` rows of inputs (and targets) from a
``numpy.random.Generator``; :func:`make_synthetic` splits them into train and test rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedbayes_flwr.data.base import DataError, Dataset, f64, fits, i64, needs, num_test_rows

__all__ = ["DEFAULT_SYNTHETIC", "GENERATORS", "SYNTHETIC", "SYNTHETIC_TARGET", "make_synthetic"]

SYNTHETIC = ("gaussian-mean", "linear", "logistic", "softmax", "sine", "mixture-1d", "ar1-student-t")
"""Names of the synthetic generators.

* ``"gaussian-mean"``: ``x ~ N(mu, noise^2 I)`` with ``mu ~ N(0, I)``; no targets.
* ``"linear"``: ``y = x.w + noise`` with ``x, w ~ N(0, I)``; real-valued targets.
* ``"logistic"``: ``y ~ Bernoulli(sigmoid(x.w + b))``; binary labels.
* ``"softmax"``: 3 classes drawn from a random linear softmax model ``softmax(x W + b)``
  with ``W ~ N(0, 4 I)``; class labels 0..2.
* ``"sine"``: ``y = 2 sin(2 x.w) + noise`` with ``w ~ N(0, I / d)``; real-valued targets.
* ``"mixture-1d"``: rows of random 1-D Gaussian-mixture likelihood specifications
  ``(w_1, m_1, v_1, ..., w_J, m_J, v_J)`` with ``J = dim`` components per row (so ``3 dim``
  columns): weights ``w ~ U(0.5, 1.5)``, means ``m ~ U(-4, 4)``, variances ``v ~ U(0.5, 4)``;
  no targets. The likelihood of a scalar parameter ``t`` is ``sum_j w_j N(t | m_j, v_j)``.
* ``"ar1-student-t"``: rows are AR(1) trajectories ``(y_0, ..., y_K)`` with ``K = dim`` steps
  (so ``dim + 1`` columns): ``y_i = c + x y_{i-1} + eps_i``, ``eps_i`` i.i.d. standard
  Student-t with :data:`AR1_NU` ``= 3`` degrees of freedom, true values :data:`AR1_C` ``= 0.5``,
  :data:`AR1_X` ``= 0.7`` (choices: the seed paper's values are not in its text). ``y_0`` is
  drawn (approximately) from the stationary distribution: the recursion run for
  :data:`AR1_WARMUP` steps from the stationary mean ``c / (1 - x)``. The noise scale is ignored;
  no targets.
"""

SYNTHETIC_TARGET = {
    "gaussian-mean": "none",
    "linear": "real",
    "logistic": "binary",
    "softmax": "multiclass",
    "sine": "real",
    "mixture-1d": "none",
    "ar1-student-t": "none",
}
"""Generator name -> the target kind (see :data:`fedbayes_flwr.data.TARGETS`) it makes."""

DEFAULT_SYNTHETIC = {"none": "gaussian-mean", "real": "linear", "binary": "logistic", "multiclass": "softmax"}
"""Target kind -> generator used when none is named."""

_SYNTHETIC_CLASSES = 3
AR1_C, AR1_X, AR1_NU = 0.5, 0.7, 3.0
"""True intercept, autoregressive coefficient and noise degrees of freedom of ``ar1-student-t``."""
AR1_WARMUP = 50
"""Steps run from the stationary mean before ``y_0`` (``0.7^50 ~ 2e-8``: the start is forgotten)."""

_Generator = Callable[[np.random.Generator, int, int, float], tuple[np.ndarray, np.ndarray | None]]


def _gaussian_mean(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    mean = rng.standard_normal(dim)
    return mean + noise_scale * rng.standard_normal((size, dim)), None


def _linear(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    x = rng.standard_normal((size, dim))
    w = rng.standard_normal(dim)
    return x, f64(x @ w + noise_scale * rng.standard_normal(size))


def _logistic(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    x = rng.standard_normal((size, dim))
    w = rng.standard_normal(dim)
    b = rng.standard_normal()
    p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
    return x, i64(rng.random(size) < p)


def _softmax(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    x = rng.standard_normal((size, dim))
    w = 2.0 * rng.standard_normal((dim, _SYNTHETIC_CLASSES))
    b = rng.standard_normal(_SYNTHETIC_CLASSES)
    logits = x @ w + b
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cum = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
    u = rng.random((size, 1))
    return x, i64(np.minimum((u > cum).sum(axis=1), _SYNTHETIC_CLASSES - 1))


def _sine(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    x = rng.standard_normal((size, dim))
    w = rng.standard_normal(dim) / np.sqrt(dim)
    return x, f64(2.0 * np.sin(2.0 * (x @ w)) + noise_scale * rng.standard_normal(size))


def _mixture_1d(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    w = rng.uniform(0.5, 1.5, (size, dim))
    m = rng.uniform(-4.0, 4.0, (size, dim))
    v = rng.uniform(0.5, 4.0, (size, dim))
    return np.stack([w, m, v], axis=2).reshape(size, 3 * dim), None


def _ar1_student_t(rng: np.random.Generator, size: int, dim: int, noise_scale: float):
    eps = rng.standard_t(AR1_NU, size=(size, AR1_WARMUP + dim))
    y = np.empty((size, AR1_WARMUP + dim + 1))
    y[:, 0] = AR1_C / (1.0 - AR1_X)
    for i in range(1, y.shape[1]):
        y[:, i] = AR1_C + AR1_X * y[:, i - 1] + eps[:, i - 1]
    return y[:, AR1_WARMUP:], None


GENERATORS: dict[str, _Generator] = {
    "gaussian-mean": _gaussian_mean,
    "linear": _linear,
    "logistic": _logistic,
    "softmax": _softmax,
    "sine": _sine,
    "mixture-1d": _mixture_1d,
    "ar1-student-t": _ar1_student_t,
}
"""Generator name -> ``f(rng, size, dim, noise_scale) -> (x, y or None)``."""


def resolve_synthetic(synthetic: str | None, target: str) -> str:
    """The generator name for `synthetic` (``None``: the default for `target`).

    Parameters
    ----------
    synthetic : str or None
        One of :data:`SYNTHETIC`, or ``None``.
    target : str
        A known target kind.

    Returns
    -------
    str
        A key of :data:`GENERATORS`.

    Raises
    ------
    DataError
        On an unknown generator name.
    """
    if synthetic is None:
        return DEFAULT_SYNTHETIC[target]
    if synthetic not in GENERATORS:
        raise DataError(f"unknown synthetic generator {synthetic!r}; known: {', '.join(SYNTHETIC)}")
    return synthetic


def make_synthetic(
    synthetic: str,
    target: str,
    *,
    seed: int,
    test_fraction: float,
    size: int,
    dim: int,
    noise_scale: float,
) -> Dataset:
    """Generate the ``"synthetic"`` dataset.

    Parameters
    ----------
    synthetic : str
        Generator name, one of :data:`SYNTHETIC`.
    target : str
        The target kind the model needs; the generator's targets must fit it.
    seed : int
        Seed of the generator; the data are a deterministic function of it.
    test_fraction : float
        Fraction of the `size` rows used as test rows (the last ones).
    size : int
        Total number of rows (train plus test), at least 2.
    dim : int
        Input dimension, at least 1 (for ``"mixture-1d"``: components per row, ``3 dim``
        columns; for ``"ar1-student-t"``: steps per trajectory, ``dim + 1`` columns).
    noise_scale : float
        Observation noise standard deviation (``gaussian-mean``, ``linear``, ``sine``).

    Returns
    -------
    Dataset
        Named ``"synthetic"``, ``holdout_rows`` 0.

    Raises
    ------
    DataError
        On bad sizes or noise, or a generator whose targets do not fit `target`.
    """
    provided = SYNTHETIC_TARGET[synthetic]
    if not fits(provided, target):
        made = "no targets" if provided == "none" else needs(provided)
        raise DataError(f"synthetic generator {synthetic!r} makes {made}; this model needs {needs(target)}")
    size, dim, noise_scale = int(size), int(dim), float(noise_scale)
    if size < 2:
        raise DataError(f"synthetic size must be at least 2 rows, got {size}")
    if dim < 1:
        raise DataError(f"synthetic dimension must be at least 1, got {dim}")
    if not (np.isfinite(noise_scale) and noise_scale > 0):
        raise DataError(f"noise scale must be a positive number, got {noise_scale}")
    rng = np.random.default_rng(seed)
    n_test = num_test_rows(size, test_fraction)
    n_train = size - n_test
    x, y = GENERATORS[synthetic](rng, size, dim, noise_scale)
    x = f64(x)
    return Dataset(
        f64(x[:n_train]),
        None if y is None else np.ascontiguousarray(y[:n_train]),
        f64(x[n_train:]),
        None if y is None else np.ascontiguousarray(y[n_train:]),
        None,
        "synthetic",
    )
