"""The embedded scikit-learn datasets: ``breast-cancer``, ``diabetes`` and ``digits``.

Each uses a fixed train/test split (``random_state=0``, stratified for classification)
independent of the run seed, so results are comparable across seeds.
"""

from __future__ import annotations

import numpy as np

from .base import DataError, Dataset, f64, fits, i64, needs

__all__ = ["EMBEDDED", "load_embedded"]

EMBEDDED = {
    "breast-cancer": ("binary", "binary labels"),
    "diabetes": ("real", "real-valued targets"),
    "digits": ("multiclass", "10-class labels"),
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
        ``holdout_rows`` is 0: the split is part of the dataset's definition.

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
    return _digits(test_fraction)


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    x_tr, x_te = _standardise(x_tr, x_te)
    return Dataset(x_tr, i64(y_tr), x_te, i64(y_te), None, "breast-cancer")


def _diabetes(test_fraction: float) -> Dataset:
    """442 x 10 regression, features and target standardised."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=0)
    x_tr, x_te = _standardise(x_tr, x_te)
    y_tr, y_te = _standardise(y_tr, y_te)
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
