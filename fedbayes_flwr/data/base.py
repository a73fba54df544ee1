"""Shared types, errors, constants and array helpers of :mod:`fedbayes_flwr.data`.

The data package knows no model names: a model states what it needs as a target kind
(:data:`TARGETS`), and the loaders check and convert the targets to that kind.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "DATASETS",
    "DATASET_DESCRIPTIONS",
    "HUB_PREFIX",
    "TARGETS",
    "DataError",
    "DataWarning",
    "Dataset",
    "check_target",
    "is_dataset_name",
]

DATASETS = ("breast-cancer", "diabetes", "digits", "synthetic", "twonorm", "mixture-1d",
            "amps-mixture", "amps-gaussian", "lda-corpus", "latent-features", "mnist-like")
"""Names of the embedded datasets accepted by :func:`fedbayes_flwr.data.load_dataset`."""

DATASET_DESCRIPTIONS = {
    "breast-cancer": "scikit-learn's Wisconsin breast cancer: 569 rows, 30 features, binary labels",
    "diabetes": "scikit-learn's diabetes: 442 rows, 10 features, real-valued targets",
    "digits": "scikit-learn's 8x8 digits: 1,797 rows, 64 pixels, 10 classes (offline MNIST stand-in)",
    "synthetic": "generated from the run seed for the model's target kind (synthetic-size, synthetic-dim)",
    "twonorm": "Breiman's twonorm: two Gaussian classes in 20 dimensions, generated (fixed seed)",
    "mixture-1d": "rows of 1-D Gaussian-mixture likelihoods for a scalar theta (DSVGD's toy target)",
    "amps-mixture": "the AMPS paper's 1-D Gaussian mixture: 30 training, 2,000 held-out points",
    "amps-gaussian": "the AMPS paper's Gaussian example: x ~ N(1, 1), 100 training points",
    "lda-corpus": "a synthetic LDA corpus: 100 words, 10 topics, 1,000 training documents",
    "latent-features": "the AMPS paper's latent-feature data: 5 binary features in 10 dimensions",
    "mnist-like": "MNIST-shaped, generated (fixed seed): 60,000 + 10,000 rows of 28x28 pixels, 10 classes",
}
"""One line per name of :data:`DATASETS` (``run_simulation.py list datasets``)."""

HUB_PREFIX = "hub:"
"""Prefix of dataset names loaded from the Hugging Face Hub, e.g. ``"hub:mnist"``."""

TARGETS = ("none", "real", "binary", "multiclass")
"""Target kinds a model can need.

* ``"none"``: inputs only, no targets (``y_train`` and ``y_test`` are ``None``).
* ``"real"``: float64 real-valued regression targets.
* ``"binary"``: int64 labels in {0, 1}.
* ``"multiclass"``: int64 class labels ``>= 0``.
"""

_NEEDS = {
    "none": "no targets (inputs only)",
    "real": "real-valued targets",
    "binary": "binary labels (0 or 1)",
    "multiclass": "class labels (integers >= 0)",
}


class DataError(ValueError):
    """Bad user data or data configuration; the message is one line saying what is wrong."""


class DataWarning(UserWarning):
    """Something about the data the user should know, e.g. rows held out as a test set."""


class Dataset(NamedTuple):
    """A train/test dataset.

    Attributes
    ----------
    x_train : numpy.ndarray
        Training inputs, float64 of shape ``(n, d)``.
    y_train : numpy.ndarray or None
        Training targets of the requested target kind (see :data:`TARGETS`): float64
        ``(n,)`` for ``"real"``, int64 ``(n,)`` for ``"binary"`` (in {0, 1}) and
        ``"multiclass"`` (integers ``>= 0``), ``None`` for ``"none"``.
    x_test : numpy.ndarray
        Test inputs, float64 of shape ``(m, d)`` with ``m >= 1``.
    y_test : numpy.ndarray or None
        Test targets, same conventions as `y_train`.
    client_id : numpy.ndarray or None
        int64 ``(n,)`` natural client id of each training row, or ``None``.
    name : str
        Dataset name (``"file:<basename>"`` for user files, ``"hub:<id>"`` for hub
        datasets).
    holdout_rows : int
        Number of rows of the source's training data held out as the test set because
        the source has no test set of its own (a user ``.npz`` without ``x_test``, a hub
        dataset without a ``"test"`` split); 0 otherwise (embedded sets, synthetic
        data, sources with their own test set). A :class:`DataWarning` reports it.
    """

    x_train: np.ndarray
    y_train: np.ndarray | None
    x_test: np.ndarray
    y_test: np.ndarray | None
    client_id: np.ndarray | None
    name: str
    holdout_rows: int = 0


def is_dataset_name(name: str) -> bool:
    """Whether `name` is a dataset name :func:`fedbayes_flwr.data.load_dataset` accepts.

    Parameters
    ----------
    name : str
        A name from :data:`DATASETS`, or ``"hub:<dataset-id>"`` with a non-empty id.

    Returns
    -------
    bool
        ``True`` for an embedded dataset or a hub name; whether a hub dataset exists is
        only known when it is loaded.
    """
    return name in DATASETS or (name.startswith(HUB_PREFIX) and bool(name[len(HUB_PREFIX):].strip()))


def check_target(target: str) -> str:
    """Return `target` if it is one of :data:`TARGETS`.

    Parameters
    ----------
    target : str
        A target kind.

    Returns
    -------
    str
        `target`, unchanged.

    Raises
    ------
    DataError
        When `target` is not a known target kind.
    """
    if target not in TARGETS:
        raise DataError(f"unknown target {target!r}; known targets: {', '.join(TARGETS)}")
    return target


def needs(target: str) -> str:
    """What a model needing `target` needs, in words (e.g. ``"binary labels (0 or 1)"``)."""
    return _NEEDS[target]


def fits(provided: str, target: str) -> bool:
    """Whether targets of kind `provided` serve a model needing `target`.

    Equal kinds fit; binary labels are also valid class labels for ``"multiclass"``.
    """
    return provided == target or (provided == "binary" and target == "multiclass")


# ------------------------------------------------------------------------ helpers


def f64(a: np.ndarray) -> np.ndarray:
    """`a` as a C-contiguous float64 array."""
    return np.ascontiguousarray(a, dtype=np.float64)


def i64(a: np.ndarray) -> np.ndarray:
    """`a` as a C-contiguous int64 array."""
    return np.ascontiguousarray(a, dtype=np.int64)


def num_test_rows(n: int, test_fraction: float) -> int:
    """Number of test rows: ``round(test_fraction * n)``, at least 1 on each side."""
    return int(min(max(1, round(test_fraction * n)), n - 1))


def one_line(exc: BaseException, limit: int = 300) -> str:
    """First non-empty line of an exception message (or its type name), shortened."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_float_array(arr: np.ndarray, key: str, where: str) -> np.ndarray:
    """`arr` as float64, all finite; `key` and `where` name it in the error message.

    Complex arrays are refused with one line (numpy would otherwise drop the imaginary parts
    with only a ComplexWarning)."""
    if np.iscomplexobj(arr):
        raise DataError(f"{where}: key '{key}' is complex-valued (dtype {arr.dtype}); "
                        f"expected real numbers")
    try:
        out = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{where}: key '{key}' must be numeric, got dtype {arr.dtype}") from None
    if not np.all(np.isfinite(out)):
        raise DataError(f"{where}: key '{key}' contains non-finite values (nan or inf)")
    return out


def as_x(arr: np.ndarray, key: str, where: str) -> np.ndarray:
    """Inputs as float64 ``(n, d)`` with ``n, d >= 1`` (1-D input becomes one column)."""
    x = as_float_array(arr, key, where)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    if x.ndim != 2:
        raise DataError(f"{where}: key '{key}' must be 1-D or 2-D, got shape {x.shape}")
    if x.shape[0] == 0:
        raise DataError(f"{where}: key '{key}' has no rows")
    if x.shape[1] == 0:
        raise DataError(f"{where}: key '{key}' has no columns (features)")
    _check_magnitude(x, key, where)
    return f64(x)


MAX_ABS_VALUE = 1e50
"""The largest magnitude a feature or a real target may have: the models form products such as
``x_i x_j`` and ``y x`` and sum them over rows, which must stay finite in float64 (1.8e308)."""


def _check_magnitude(a: np.ndarray, key: str, where: str) -> None:
    big = float(np.max(np.abs(a))) if a.size else 0.0
    if big > MAX_ABS_VALUE:
        raise DataError(f"{where}: key '{key}' has a value of magnitude {big:.3g}, above "
                        f"{MAX_ABS_VALUE:g}: the model's products of values (x_i x_j summed over "
                        f"rows) would overflow float64; rescale the data (e.g. standardise it)")


MAX_CLASSES = 100_000
"""The largest number of classes a multiclass target may have (a label is a class index: one of
``1e20`` would ask for a softmax of ``1e20`` outputs, and wrap when cast to int64)."""


def as_y(arr: np.ndarray, key: str, where: str, target: str) -> np.ndarray:
    """Targets as 1-D arrays of kind `target` (not ``"none"``), labels checked."""
    y = as_float_array(arr, key, where)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where}: key '{key}' must be 1-D, got shape {y.shape}")
    if target == "binary":
        _check_labels(y[(y != 0) & (y != 1)], key, where, "0 or 1")
        return i64(y)
    if target == "multiclass":
        _check_labels(y[(y < 0) | (y != np.floor(y)) | (y >= MAX_CLASSES)], key, where,
                      f"integers in [0, {MAX_CLASSES}) (class indices)")
        return i64(y)
    _check_magnitude(y, key, where)
    return f64(y)


def _check_labels(bad: np.ndarray, key: str, where: str, rule: str) -> None:
    """Raise a DataError listing (up to 10 of) the distinct `bad` label values."""
    bad = np.unique(bad)
    if bad.size:
        shown = [int(v) if float(v).is_integer() else float(v) for v in bad[:10]]
        more = ", ..." if bad.size > 10 else ""
        raise DataError(f"{where}: key '{key}' labels must be {rule}, found {str(shown)[:-1]}{more}]")
