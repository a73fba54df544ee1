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
    "kernel_stein_discrepancy",
    "ksd_of_posterior",
    "marginal_w1",
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

W1_SEED = np.array([4242, 17], dtype=np.int32)
KSD_SEED = np.array([5151, 23], dtype=np.int32)


def marginal_w1(posterior, reference_draws: np.ndarray, seed: np.ndarray = W1_SEED,
                n: int | None = None) -> np.ndarray:
    """Per-dimension 1-Wasserstein distance between a posterior's marginals and reference draws.

    Parameters
    ----------
    posterior : fedbayes_flwr.inference.posterior.Posterior
        Any posterior; only ``posterior.sample(seed, n)`` is used.
    reference_draws : np.ndarray
        ``(m, d)`` draws from the reference (exact posterior, long reference chain).
    seed : np.ndarray, default ``W1_SEED``
        Stateless ``int32[2]`` seed for the posterior's draws.
    n : int, optional
        Number of posterior draws; defaults to ``m``, so the result can be compared with the W1
        between two independent reference sets of the same size.

    Returns
    -------
    np.ndarray
        ``(d,)`` ``W1`` of the empirical marginals (``scipy.stats.wasserstein_distance``).

    Raises
    ------
    ValueError
        If ``reference_draws`` is not ``(m, d)`` with ``d == posterior.dim``.
    """
    from scipy.stats import wasserstein_distance

    ref = np.asarray(reference_draws, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[0] < 1 or ref.shape[1] != posterior.dim:
        raise ValueError(f"reference_draws must have shape (m, {posterior.dim}), got {ref.shape}")
    draws = np.asarray(posterior.sample(seed, ref.shape[0] if n is None else int(n)),
                       dtype=np.float64)
    return np.array([wasserstein_distance(draws[:, j], ref[:, j]) for j in range(ref.shape[1])])


def kernel_stein_discrepancy(samples: np.ndarray, scores: np.ndarray, beta: float = -0.5,
                             c: float = 1.0) -> float:
    """Kernel Stein discrepancy of a sample with the inverse multiquadric (IMQ) kernel.

    With ``k(x, y) = (c^2 + ||x - y||^2)^beta`` and target scores ``s(x) = grad log p(x)``, the
    Stein kernel is

    ``k_p(x, y) = s(x).s(y) k + s(x).grad_y k + s(y).grad_x k + tr(grad_x grad_y k)``
    ``= s(x).s(y) k + 2 beta u^(beta-1) (s(y) - s(x)).(x - y)``
    ``  - 4 beta (beta - 1) u^(beta-2) r^2 - 2 beta d u^(beta-1)``,

    where ``r^2 = ||x - y||^2`` and ``u = c^2 + r^2``. The result is the V-statistic
    ``sqrt(mean_{i,j} k_p(x_i, x_j))``: zero in the limit only for samples from ``p`` (for
    ``-1 < beta < 0``). Needs only the unnormalised target's gradient. ``O(n^2 d)`` time and
    ``O(n^2)`` memory: meant for ``n`` up to a few thousand.

    Parameters
    ----------
    samples : np.ndarray
        ``(n, d)`` points.
    scores : np.ndarray
        ``(n, d)`` ``grad log p`` at the points (e.g. from
        :meth:`fedbayes_flwr.models.Model.log_density_and_grad`).
    beta : float, default -0.5
        IMQ exponent, in ``(-1, 0)``.
    c : float, default 1.0
        IMQ scale, ``> 0``.

    Returns
    -------
    float
        The KSD (square root of the V-statistic).

    References
    ----------
    Gorham & Mackey (2017), "Measuring Sample Quality with Kernels", ICML, Section 3 (Stein kernel,
    eq. for ``k_0``) and Theorem 8 (the IMQ KSD detects non-convergence for ``-1 < beta < 0``);
    Liu, Lee & Jordan (2016), "A Kernelized Stein Discrepancy for Goodness-of-fit Tests", ICML.
    """
    x = np.asarray(samples, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or s.shape != x.shape:
        raise ValueError(f"samples and scores must both have shape (n, d); got {x.shape} and "
                         f"{s.shape}")
    if not (-1.0 < beta < 0.0):
        raise ValueError(f"beta must lie in (-1, 0), got {beta}")
    if not c > 0:
        raise ValueError(f"c must be > 0, got {c}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(s))):
        raise ValueError("samples and scores must be finite")
    d = x.shape[1]
    sq = np.sum(x**2, axis=1)
    r2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    u = c**2 + r2
    xs = x @ s.T  # xs[i, j] = x_i . s_j
    xs_diag = np.diag(xs)
    # (s_j - s_i) . (x_i - x_j) = x_i.s_j - x_j.s_j - x_i.s_i + x_j.s_i
    cross = xs - xs_diag[None, :] - xs_diag[:, None] + xs.T
    kp = ((s @ s.T) * u**beta + 2.0 * beta * u ** (beta - 1.0) * cross
          - 4.0 * beta * (beta - 1.0) * u ** (beta - 2.0) * r2 - 2.0 * beta * d * u ** (beta - 1.0))
    return float(np.sqrt(max(np.mean(kp), 0.0)))


def ksd_of_posterior(posterior, model, x, y, prior, n: int = 1000,
                     seed: np.ndarray = KSD_SEED) -> float:
    """IMQ kernel Stein discrepancy of ``n`` draws of ``posterior`` from the model's posterior.

    Parameters
    ----------
    posterior : fedbayes_flwr.inference.posterior.Posterior
        Only ``posterior.sample(seed, n)`` is used.
    model : fedbayes_flwr.models.Model
        Supplies ``log_density_and_grad`` (scores of the unnormalised posterior).
    x, y : np.ndarray
        The pooled data (``y`` may be ``None`` for models without targets).
    prior : fedbayes_flwr.inference.gaussian.NaturalGaussian
        The prior of the target posterior.
    n : int, default 1000
        Number of draws (the cost is ``O(n^2 d)``).
    seed : np.ndarray, default ``KSD_SEED``
        Stateless ``int32[2]`` seed.

    Returns
    -------
    float
        See :func:`kernel_stein_discrepancy` (default IMQ ``beta = -1/2``, ``c = 1``).

    References
    ----------
    Gorham & Mackey (2017), "Measuring Sample Quality with Kernels", ICML.
    """
    draws = np.asarray(posterior.sample(seed, int(n)), dtype=np.float64)
    _, scores = model.log_density_and_grad(draws, x, y, prior=prior)
    return kernel_stein_discrepancy(draws, scores)


# ---- the 1-D Gaussian-mixture toy of DSVGD: KL to the exact global posterior on a grid --------

__all__ += [
    "MIXTURE_1D_GRID_POINTS",
    "MIXTURE_1D_SUPPORT",
    "mixture_1d_grid",
    "mixture_1d_kl",
    "mixture_1d_log_likelihood",
    "mixture_1d_optimal_density",
]

#: Support ``[-6, 6]`` of the uniform prior of the 1-D mixture toy (Kassab & Simeone 2022, Sec. 7.1).
MIXTURE_1D_SUPPORT = (-6.0, 6.0)

#: Number of points of the quadrature grid over :data:`MIXTURE_1D_SUPPORT` (spacing 0.003).
MIXTURE_1D_GRID_POINTS = 4001


def mixture_1d_grid(support: tuple[float, float] = MIXTURE_1D_SUPPORT,
                    num: int = MIXTURE_1D_GRID_POINTS) -> np.ndarray:
    """The fixed quadrature grid of the mixture toy: ``num`` equispaced points spanning ``support``.

    Parameters
    ----------
    support : (float, float), default ``(-6.0, 6.0)``
        ``(low, high)``, the support of the uniform prior; the grid's end points.
    num : int, default 4001
        Number of grid points (at least 2).

    Returns
    -------
    numpy.ndarray
        ``(num,)`` float64.
    """
    low, high = float(support[0]), float(support[1])
    if not (np.isfinite(low) and np.isfinite(high) and low < high) or int(num) < 2:
        raise ValueError(f"need a finite support low < high and num >= 2, got {support}, {num}")
    return np.linspace(low, high, int(num))


def _mixture_rows(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, means and variances ``(n, J)`` of likelihood rows ``(w_1, m_1, v_1, ...)``.

    Zero-weight components get variance 1 (their mean and variance are ignored)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 1 or rows.shape[1] < 3 or rows.shape[1] % 3:
        raise ValueError(f"mixture rows must have shape (n, 3 J) with n, J >= 1, got {rows.shape}")
    if not np.all(np.isfinite(rows)):
        raise ValueError("mixture rows must be finite")
    w, m, v = rows[:, 0::3], rows[:, 1::3], rows[:, 2::3]
    if np.any(w < 0) or np.any(np.all(w == 0, axis=1)):
        raise ValueError("mixture weights must be >= 0 with at least one positive weight per row")
    if np.any(v[w > 0] <= 0):
        raise ValueError("mixture variances of positive-weight components must be > 0")
    return w, m, np.where(w > 0, v, 1.0)


def mixture_1d_log_likelihood(rows, theta) -> np.ndarray:
    """``sum_i log sum_j w_ij N(theta | m_ij, v_ij)`` at each point of ``theta`` (pure numpy).

    Parameters
    ----------
    rows : array_like
        ``(n, 3 J)`` likelihood rows ``(w_1, m_1, v_1, ..., w_J, m_J, v_J)`` (``v`` a variance;
        zero-weight components contribute nothing), one row per local likelihood factor.
    theta : array_like
        ``(M,)`` points.

    Returns
    -------
    numpy.ndarray
        ``(M,)`` float64, finite (log-sum-exp over the components of each row).

    References
    ----------
    Kassab & Simeone (2022), Section 7.1: ``p_k(theta) = p_0(theta) exp(-L_k(theta) / alpha)``
    with the local likelihoods ``N(theta | 1, 4)`` and ``N(theta | -3, 1) + N(theta | 3, 2)``.
    """
    w, m, v = _mixture_rows(rows)
    t = np.asarray(theta, dtype=np.float64).reshape(-1)[:, None, None]
    with np.errstate(divide="ignore"):
        log_w = np.where(w > 0, np.log(np.where(w > 0, w, 1.0)), -np.inf)
    comp = log_w - 0.5 * np.log(2.0 * np.pi * v) - 0.5 * (t - m) ** 2 / v  # (M, n, J)
    top = np.max(comp, axis=2, keepdims=True)
    per_row = top[..., 0] + np.log(np.sum(np.exp(comp - top), axis=2))
    return per_row.sum(axis=1)


def _log_normalised_on_grid(log_q: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """``log_q`` minus the log of its trapezoid integral over ``grid`` (stable in log space)."""
    top = np.max(log_q)
    if not np.isfinite(top):
        raise ValueError("the log density must be finite somewhere on the grid")
    mass = np.trapezoid(np.exp(log_q - top), grid)
    return log_q - top - np.log(mass)


def _check_grid(grid) -> np.ndarray:
    grid = np.asarray(grid, dtype=np.float64)
    if grid.ndim != 1 or grid.size < 2 or np.any(np.diff(grid) <= 0):
        raise ValueError("grid must be a 1-D increasing array of at least 2 points")
    return grid


def mixture_1d_optimal_density(rows, grid) -> np.ndarray:
    """Density of the exact global posterior ``q_opt`` of the mixture toy on a grid.

    ``q_opt(theta) ∝ U(theta | support) prod_i sum_j w_ij N(theta | m_ij, v_ij)``, normalised by
    the trapezoid rule over ``grid``, which must span the uniform prior's support (e.g.
    :func:`mixture_1d_grid`): the prior is then a constant on the grid and cancels.

    Parameters
    ----------
    rows : array_like
        ``(n, 3 J)`` likelihood rows (see :func:`mixture_1d_log_likelihood`), every agent's.
    grid : array_like
        ``(M,)`` increasing points spanning the support.

    Returns
    -------
    numpy.ndarray
        ``(M,)`` density values (trapezoid integral over ``grid`` equal to 1).

    References
    ----------
    Kassab & Simeone (2022), eq. (2) (``q_opt``) and Section 7.1, Fig. 2 (the shaded area).
    """
    grid = _check_grid(grid)
    return np.exp(_log_normalised_on_grid(mixture_1d_log_likelihood(rows, grid), grid))


def mixture_1d_kl(log_q_on_grid, rows, grid) -> float:
    """``KL(q || q_opt)`` of the mixture toy by trapezoid quadrature on a grid.

    ``q`` is given by its log density on ``grid`` (unnormalised is fine: it is truncated to the
    grid's range and renormalised there by the trapezoid rule); ``q_opt`` is
    :func:`mixture_1d_optimal_density`. Computed in log space as
    ``int q(theta) (log q(theta) - log q_opt(theta)) dtheta``, with ``0 log 0 = 0`` where ``q``
    vanishes (``log_q = -inf``).

    Parameters
    ----------
    log_q_on_grid : array_like
        ``(M,)`` log density of ``q`` on ``grid`` (``-inf`` allowed, finite somewhere).
    rows : array_like
        ``(n, 3 J)`` likelihood rows of every agent.
    grid : array_like
        ``(M,)`` increasing points spanning the prior's support (e.g. :func:`mixture_1d_grid`).

    Returns
    -------
    float
        The KL divergence in nats, ``>= 0`` up to quadrature error (clipped at 0).

    References
    ----------
    Kassab & Simeone (2022), Section 7.1, Fig. 3: ``KL(q || q_opt)`` against communication rounds.
    """
    grid = _check_grid(grid)
    log_q = np.asarray(log_q_on_grid, dtype=np.float64).reshape(-1)
    if log_q.shape != grid.shape:
        raise ValueError(f"log_q_on_grid must have shape {grid.shape}, got {log_q.shape}")
    if np.any(np.isnan(log_q)) or np.any(log_q == np.inf):
        raise ValueError("log_q_on_grid must not contain nan or +inf")
    log_q = _log_normalised_on_grid(log_q, grid)
    log_opt = _log_normalised_on_grid(mixture_1d_log_likelihood(rows, grid), grid)
    q = np.exp(log_q)
    with np.errstate(invalid="ignore"):
        integrand = np.where(q > 0, q * (log_q - log_opt), 0.0)
    return float(max(np.trapezoid(integrand, grid), 0.0))
