"""Predictive-performance metrics for federated Bayesian models (pure numpy).

All metrics are computed from *predictive* quantities (probabilities, or Gaussian means and
variances), so they apply unchanged to any approximate posterior. Classification metrics follow
the usual definitions: accuracy, negative log predictive probability (NLL), expected calibration
error (ECE, Guo et al. 2017) and the Brier score.

Confidence binning
------------------
For ``C`` classes the confidence ``max_c p_c`` lies in ``[1/C, 1]``; ECE and the reliability
diagram use ``num_bins`` equal-width bins over that interval (``[0.5, 1]`` for binary problems).
Bins are left-closed, except the last one, which also contains ``1``. Binary inputs are handled
as the two-class probabilities ``[1 - p1, p1]``, so the binary and multiclass functions agree.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "binary_classification_metrics",
    "multiclass_classification_metrics",
    "regression_metrics",
    "reliability_diagram",
]

_EPS = 1e-12
_ROW_SUM_ATOL = 1e-4


def _check_probs(probs: np.ndarray, name: str) -> np.ndarray:
    """Check that ``probs`` is finite and within ``[0, 1]``; return it as float64."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.size == 0:
        raise ValueError(f"{name} must be non-empty")
    if not np.all(np.isfinite(probs)):
        raise ValueError(f"{name} must be finite")
    if np.any(probs < 0.0) or np.any(probs > 1.0):
        raise ValueError(f"{name} must lie in [0, 1]")
    return probs


def _check_labels(y: np.ndarray, m: int, num_classes: int) -> np.ndarray:
    """Check that ``y`` holds ``m`` integer labels in ``{0, ..., num_classes - 1}``."""
    y = np.asarray(y)
    if y.shape != (m,):
        raise ValueError(f"y must have shape ({m},), got {y.shape}")
    if y.dtype == bool:
        y = y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.number):
        raise ValueError("y must be numeric")
    if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
        raise ValueError("y must contain integer labels")
    y = y.astype(np.int64)
    if np.any(y < 0) or np.any(y >= num_classes):
        raise ValueError(f"y labels must lie in {{0, ..., {num_classes - 1}}}")
    return y


def _as_class_probs(p1_or_probs: np.ndarray, name: str) -> np.ndarray:
    """Return an ``(m, C)`` probability matrix; a 1-D ``p1`` becomes ``[1 - p1, p1]``."""
    probs = _check_probs(p1_or_probs, name)
    if probs.ndim == 1:
        return np.stack([1.0 - probs, probs], axis=1)
    if probs.ndim != 2 or probs.shape[1] < 2:
        raise ValueError(f"{name} must have shape (m,) or (m, C) with C >= 2, got {probs.shape}")
    if not np.allclose(probs.sum(axis=1), 1.0, atol=_ROW_SUM_ATOL):
        raise ValueError(f"{name} rows must sum to 1")
    return probs


def _predict(probs: np.ndarray) -> np.ndarray:
    """Predicted class: argmax, with two-class ties (``p1 = 0.5``) going to class 1."""
    if probs.shape[1] == 2:
        return (probs[:, 1] >= 0.5).astype(np.int64)
    return probs.argmax(axis=1)


def _bin_edges(num_classes: int, num_bins: int) -> np.ndarray:
    """Equal-width confidence bin edges over ``[1 / num_classes, 1]``."""
    if int(num_bins) != num_bins or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins}")
    return np.linspace(1.0 / num_classes, 1.0, int(num_bins) + 1)


def _binned_calibration(
    probs: np.ndarray, y: np.ndarray, num_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Shared binning for ECE and reliability diagrams.

    Parameters
    ----------
    probs : np.ndarray
        Validated ``(m, C)`` class probabilities.
    y : np.ndarray
        Validated integer labels, shape ``(m,)``.
    num_bins : int
        Number of equal-width confidence bins over ``[1/C, 1]``.

    Returns
    -------
    edges : np.ndarray
        Bin edges, shape ``(num_bins + 1,)``.
    count : np.ndarray
        Number of points per bin.
    confidence : np.ndarray
        Mean confidence per bin (NaN for empty bins).
    accuracy : np.ndarray
        Accuracy per bin (NaN for empty bins).
    """
    edges = _bin_edges(probs.shape[1], num_bins)
    conf = probs.max(axis=1)
    correct = (_predict(probs) == y).astype(np.float64)
    # Left-closed bins; the last bin also holds confidence 1. Clip guards rounding at 1/C.
    idx = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, len(edges) - 2)
    nb = len(edges) - 1
    count = np.bincount(idx, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.bincount(idx, weights=conf, minlength=nb) / count
        accuracy = np.bincount(idx, weights=correct, minlength=nb) / count
    return edges, count, confidence, accuracy


def _ece(probs: np.ndarray, y: np.ndarray, num_bins: int) -> float:
    """Expected calibration error ``sum_b (n_b / m) |acc_b - conf_b|``."""
    _, count, confidence, accuracy = _binned_calibration(probs, y, num_bins)
    nonempty = count > 0
    gaps = np.abs(accuracy[nonempty] - confidence[nonempty])
    return float(np.sum(count[nonempty] * gaps) / len(y))


def multiclass_classification_metrics(
    probs: np.ndarray, y: np.ndarray, num_bins: int = 10
) -> dict[str, float]:
    """Accuracy, NLL, ECE and Brier score of multiclass predictive probabilities.

    Parameters
    ----------
    probs : np.ndarray
        Predictive class probabilities, shape ``(m, C)``, rows summing to 1.
    y : np.ndarray
        Integer labels in ``{0, ..., C - 1}``, shape ``(m,)``.
    num_bins : int, default 10
        Number of equal-width confidence bins over ``[1/C, 1]`` for the ECE.

    Returns
    -------
    dict of str to float
        ``test_accuracy`` (argmax prediction; for ``C = 2`` ties go to class 1, matching
        :func:`binary_classification_metrics`), ``test_nll`` (mean ``-log p_y`` with ``p_y``
        clipped to ``[1e-12, 1 - 1e-12]``), ``test_ece`` and ``test_brier`` (mean over rows of
        ``sum_c (p_c - onehot_c)^2``).

    Raises
    ------
    ValueError
        If ``probs`` is not an ``(m, C)`` probability matrix or ``y`` holds invalid labels.
    """
    probs = _check_probs(probs, "probs")
    if probs.ndim != 2:
        raise ValueError(f"probs must have shape (m, C), got {probs.shape}")
    probs = _as_class_probs(probs, "probs")
    m, c = probs.shape
    y = _check_labels(y, m, c)
    p_true = np.clip(probs[np.arange(m), y], _EPS, 1.0 - _EPS)
    onehot = np.eye(c)[y]
    return {
        "test_accuracy": float(np.mean(_predict(probs) == y)),
        "test_nll": float(-np.mean(np.log(p_true))),
        "test_ece": _ece(probs, y, num_bins),
        "test_brier": float(np.mean(np.sum((probs - onehot) ** 2, axis=1))),
    }


def binary_classification_metrics(
    p1: np.ndarray, y: np.ndarray, num_bins: int = 10
) -> dict[str, float]:
    """Accuracy, NLL, ECE and Brier score of binary predictive probabilities.

    Parameters
    ----------
    p1 : np.ndarray
        Predictive probability of class 1, shape ``(m,)``.
    y : np.ndarray
        Labels in ``{0, 1}``, shape ``(m,)``.
    num_bins : int, default 10
        Number of equal-width bins over the confidence ``max(p1, 1 - p1)`` in ``[0.5, 1]``.

    Returns
    -------
    dict of str to float
        ``test_accuracy`` (prediction ``1[p1 >= 0.5]``), ``test_nll``, ``test_ece`` and
        ``test_brier`` (mean ``(p1 - y)^2``). The first three equal those of
        :func:`multiclass_classification_metrics` on ``[1 - p1, p1]``; its Brier score sums over
        both classes and is therefore twice this one.

    Raises
    ------
    ValueError
        If ``p1`` is not a 1-D probability vector or ``y`` is not a matching 0/1 vector.
    """
    p1 = _check_probs(p1, "p1")
    if p1.ndim != 1:
        raise ValueError(f"p1 must have shape (m,), got {p1.shape}")
    y = _check_labels(y, p1.shape[0], 2)
    p_true = np.clip(np.where(y == 1, p1, 1.0 - p1), _EPS, 1.0 - _EPS)
    return {
        "test_accuracy": float(np.mean((p1 >= 0.5) == (y == 1))),
        "test_nll": float(-np.mean(np.log(p_true))),
        "test_ece": _ece(_as_class_probs(p1, "p1"), y, num_bins),
        "test_brier": float(np.mean((p1 - y) ** 2)),
    }


def regression_metrics(mean: np.ndarray, var: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """RMSE and Gaussian negative log predictive density.

    Parameters
    ----------
    mean : np.ndarray
        Predictive means, shape ``(m,)`` or ``(m, d)``.
    var : np.ndarray
        Predictive variances (``> 0``), same shape as ``mean``.
    y : np.ndarray
        Targets, same shape as ``mean``.

    Returns
    -------
    dict of str to float
        ``test_rmse`` (root mean squared error over all entries) and ``test_nll`` (mean over test
        rows of ``-log N(y | mean, var)``, summed over the ``d`` output dimensions of a row).

    Raises
    ------
    ValueError
        If shapes disagree, inputs are not finite, or any variance is not positive.
    """
    mean = np.asarray(mean, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if mean.ndim not in (1, 2) or mean.shape[0] == 0:
        raise ValueError(f"mean must have shape (m,) or (m, d) with m >= 1, got {mean.shape}")
    for name, arr in (("var", var), ("y", y)):
        if arr.shape != mean.shape:
            raise ValueError(f"{name} must have shape {mean.shape}, got {arr.shape}")
    for name, arr in (("mean", mean), ("var", var), ("y", y)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
    if np.any(var <= 0.0):
        raise ValueError("var must be strictly positive")
    sq = (y - mean) ** 2
    logpdf = -0.5 * (np.log(2.0 * np.pi * var) + sq / var)
    row_logpdf = logpdf if logpdf.ndim == 1 else logpdf.sum(axis=1)
    return {
        "test_rmse": float(np.sqrt(np.mean(sq))),
        "test_nll": float(-np.mean(row_logpdf)),
    }


def reliability_diagram(
    p1_or_probs: np.ndarray, y: np.ndarray, num_bins: int = 10
) -> dict[str, list]:
    """Per-bin data for a reliability diagram (same binning as the ECE).

    Parameters
    ----------
    p1_or_probs : np.ndarray
        Binary probabilities of class 1, shape ``(m,)``, or class probabilities ``(m, C)``.
    y : np.ndarray
        Integer labels, shape ``(m,)``.
    num_bins : int, default 10
        Number of equal-width confidence bins over ``[1/C, 1]``.

    Returns
    -------
    dict of str to list
        ``bin_lower``, ``bin_upper``, ``confidence`` (mean confidence), ``accuracy`` and
        ``count`` per bin; empty bins have count 0 and NaN confidence/accuracy.

    Raises
    ------
    ValueError
        On invalid probabilities or labels.
    """
    probs = _as_class_probs(p1_or_probs, "p1_or_probs")
    y = _check_labels(y, probs.shape[0], probs.shape[1])
    edges, count, confidence, accuracy = _binned_calibration(probs, y, num_bins)
    return {
        "bin_lower": edges[:-1].tolist(),
        "bin_upper": edges[1:].tolist(),
        "confidence": confidence.tolist(),
        "accuracy": accuracy.tolist(),
        "count": [int(n) for n in count],
    }


# ---- distances to a reference posterior (sampler quality) ----------------------------------


# ---- the 1-D Gaussian-mixture toy of DSVGD: KL to the exact global posterior on a grid --------


