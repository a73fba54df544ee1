"""The embedded datasets: scikit-learn's ``breast-cancer``, ``diabetes`` and ``digits``, the
generated ``twonorm`` and ``mnist-like`` (:mod:`.mnist_like`), and the ``mixture-1d``
likelihood rows.

Each uses a fixed train/test split (``random_state=0``, stratified for classification)
independent of the run seed, so results are comparable across seeds; ``twonorm`` is also
generated from a fixed internal seed. ``mixture-1d`` has no split: its rows are likelihood
specifications, not samples, and serve as both train and test rows.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.data.base import DataError, Dataset, f64, fits, i64, needs
from fedbayes_flwr.data.mnist_like import make_mnist_like

__all__ = ["EMBEDDED", "MIXTURE_1D_ROWS", "TWONORM_DIM", "TWONORM_SEED", "TWONORM_SIZE", "load_embedded"]

TWONORM_SIZE = 7400
"""Rows of ``twonorm`` (train plus test), as in Breiman (1996)."""

TWONORM_DIM = 20
"""Features of ``twonorm``."""

TWONORM_SEED = 1996
"""Fixed seed of the ``twonorm`` generator: the same data for every run."""

MIXTURE_1D_ROWS = np.array([[1.0, 1.0, 4.0, 0.0, 0.0, 1.0],
                            [1.0, -3.0, 1.0, 1.0, 3.0, 2.0]])
"""The two agents of the DSVGD 1-D toy, one likelihood row each: ``(w_1, m_1, v_1, w_2, m_2,
v_2)`` meaning ``sum_j w_j N(theta | m_j, v_j)`` (``v`` a variance). Agent 1: ``N(theta | 1, 4)``
(second component has weight 0, dummy variance 1); agent 2:
``N(theta | -3, 1) + N(theta | 3, 2)``. Kassab & Simeone (2022), Section 7.1."""

EMBEDDED = {
    "breast-cancer": ("binary", "binary labels"),
    "diabetes": ("real", "real-valued targets"),
    "digits": ("multiclass", "10-class labels"),
    "twonorm": ("binary", "binary labels"),
    "mixture-1d": ("none", "no targets (likelihood rows)"),
    "mnist-like": ("multiclass", "10-class labels"),
}
"""Embedded set name -> (target kind it provides, that kind in words)."""


def load_embedded(name: str, target: str, test_fraction: float) -> Dataset:
    """Load one of the embedded scikit-learn sets for a model needing `target`.

    Parameters
    ----------
    name : str
        A key of :data:`EMBEDDED`.
    target : str
        The target kind the model needs, one of :data:`fedbayes_flwr.data.TARGETS`.
    test_fraction : float
        Fraction of rows held out as test set, in (0, 1).

    Returns
    -------
    Dataset
        ``holdout_rows`` is 0: the split is part of the dataset's definition (``mixture-1d``
        ignores `test_fraction`: its test rows are its training rows; ``mnist-like`` too: its
        split is MNIST's 60,000 / 10,000).

    Raises
    ------
    DataError
        When the set's targets do not fit `target`, or the split cannot be made.
    """
    provided, words = EMBEDDED[name]
    if not fits(provided, target):
        raise DataError(f"dataset {name!r} has {words}; this model needs {needs(target)}")
    if name == "breast-cancer":
        return _breast_cancer(test_fraction)
    if name == "diabetes":
        return _diabetes(test_fraction)
    if name == "twonorm":
        return _twonorm(test_fraction)
    if name == "mixture-1d":
        return _mixture_1d()
    if name == "mnist-like":
        return make_mnist_like()
    return _digits(test_fraction)


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardise `train` and `test` with the training mean and std (ddof=0)."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return f64((train - mean) / std), f64((test - mean) / std)


def _breast_cancer(test_fraction: float) -> Dataset:
    """569 x 30, binary labels, standardised features."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=0, stratify=y
    )
    x_tr, x_te = standardise(x_tr, x_te)
    return Dataset(x_tr, i64(y_tr), x_te, i64(y_te), None, "breast-cancer")


def _diabetes(test_fraction: float) -> Dataset:
    """442 x 10 regression, features and target standardised."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=0)
    x_tr, x_te = standardise(x_tr, x_te)
    y_tr, y_te = standardise(y_tr, y_te)
    return Dataset(x_tr, y_tr, x_te, y_te, None, "diabetes")


def _digits(test_fraction: float) -> Dataset:
    """1797 8x8 digits, pixels scaled to [0, 1] (not standardised), 10 classes."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    try:
        x_tr, x_te, y_tr, y_te = train_test_split(
            x, y, test_size=test_fraction, random_state=0, stratify=y
        )
    except ValueError as exc:  # e.g. a test set smaller than the number of classes
        raise DataError(f"dataset 'digits': cannot split with test fraction {test_fraction}: {exc}") from None
    # Pixel intensities are 0..16: scale to [0, 1], no standardisation.
    return Dataset(f64(x_tr / 16.0), i64(y_tr), f64(x_te / 16.0), i64(y_te), None, "digits")


def _twonorm(test_fraction: float) -> Dataset:
    """Breiman's twonorm: 7400 x 20, ``x | y ~ N(+-a 1, I)``, ``a = 2 / sqrt(20)``, balanced.

    Generated from :data:`TWONORM_SEED`: exactly 3700 rows per class (labels shuffled),
    ``x = (2 y - 1) a 1 + N(0, I)``. Features are not standardised (they already have unit
    within-class variance, and the class means ``+-a`` keep their meaning). Stratified split
    with ``random_state=0`` as the scikit-learn sets.
    """
    from sklearn.model_selection import train_test_split

    rng = np.random.default_rng(TWONORM_SEED)
    y = rng.permutation(np.repeat(np.array([0, 1]), TWONORM_SIZE // 2))
    a = 2.0 / np.sqrt(TWONORM_DIM)
    x = (2.0 * y[:, None] - 1.0) * a + rng.standard_normal((TWONORM_SIZE, TWONORM_DIM))
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=0, stratify=y
    )
    return Dataset(f64(x_tr), i64(y_tr), f64(x_te), i64(y_te), None, "twonorm")


def _mixture_1d() -> Dataset:
    """The two likelihood rows of :data:`MIXTURE_1D_ROWS`, as train and as test rows."""
    return Dataset(f64(MIXTURE_1D_ROWS), None, f64(MIXTURE_1D_ROWS), None, None, "mixture-1d")
