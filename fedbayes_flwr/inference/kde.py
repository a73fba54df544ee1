"""Isotropic Gaussian kernel density estimates (KDEs) of particle sets.

Pure functions over float64 numpy arrays (particles ``(N, d)``, one a row): the bandwidth rules
(:func:`kde_bandwidth`), log densities and scores computed with log-sum-exp and softmax weights
(an optional kernel-term floor; :func:`kde_log_density`, :func:`kde_score`), the score of a ratio
of KDEs (:func:`log_ratio_score`), the form of DSVGD's targets such as
``q^(i)(theta) / q^(i-1)(theta) t_k^(i-1)(theta)``, and the variance-keeping shrinkage of a KDE's
centres (:func:`shrink_kde`, :func:`ratio_kdes`). Used by DSVGD
(:mod:`fedbayes_flwr.algorithms.dsvgd`) and by the 1-D mixture model's KDE predictive.

The public reference code (kclip/DSVGD, ``Library/general_functions.py``) floors each kernel term
at ``1e-9`` and the density at ``1e-10`` before the log; this module floors only where asked.

References
----------
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein Variational
Gradient Descent", Section 5 (the KDE targets) and Section 7 (KDE bandwidth 0.55).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

#: Standard deviation :func:`kde_bandwidth` returns with ``rule="auto"`` when the particles have no
#: spread (``N = 1``, or every particle equal).
DEGENERATE_KDE_BANDWIDTH = 1.0
#: The KDE bandwidth (an absolute standard deviation) of the paper's experiments (Section 7).
PAPER_KDE_BANDWIDTH = 0.55


def as_particles(x, name: str = "particles") -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty (N, d) array, got shape {arr.shape}")
    return arr


def positive(value, name: str) -> float:
    value = float(value)
    if not np.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a finite positive number, got {value}")
    return value


def kde_bandwidth(particles, rule: str | float = "auto") -> float:
    """The standard deviation of the isotropic Gaussian KDE kernel for a particle set.

    Parameters
    ----------
    particles : array_like
        ``(N, d)`` particles (the KDE centres).
    rule : {"auto"} or float
        ``"auto"``: Scott's rule on the particles' spread, ``mean_k(std_k) * N^(-1/(d + 4))`` where
        ``std_k`` is the sample standard deviation (``ddof = 1``) of coordinate ``k``; when the
        particles have no spread (``N = 1``, or all equal) it returns
        :data:`DEGENERATE_KDE_BANDWIDTH` (``1.0``). A float: that absolute standard deviation,
        whatever the particles (``0.55``, :data:`PAPER_KDE_BANDWIDTH`, reproduces the paper); it
        must be finite and positive.

    Returns
    -------
    float
        A positive standard deviation ``sigma``; the kernel is ``N(x | c_n, sigma^2 I)``.

    Notes
    -----
    In high dimension ``N^(-1/(d + 4))`` is close to 1, so ``"auto"`` is then about the average
    per-coordinate spread.

    References
    ----------
    Scott (1992), "Multivariate Density Estimation", the ``n^(-1/(d+4))`` factor. Kassab & Simeone
    (2022), Section 7 (KDE bandwidth 0.55).
    """
    x = as_particles(particles)
    if isinstance(rule, str):
        if rule != "auto":
            raise ValueError(f"rule must be 'auto' or a positive float, got {rule!r}")
        n, d = x.shape
        if n < 2:
            return DEGENERATE_KDE_BANDWIDTH
        spread = float(np.mean(np.std(x, axis=0, ddof=1)))
        if not spread > 0.0:
            return DEGENERATE_KDE_BANDWIDTH
        return spread * float(n) ** (-1.0 / (d + 4))
    return positive(rule, "KDE bandwidth")


def _kde_logits(x, centres, bandwidth) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    x = as_particles(x, "x")
    c = as_particles(centres, "centres")
    if x.shape[1] != c.shape[1]:
        raise ValueError(f"x has dimension {x.shape[1]}, centres {c.shape[1]}")
    bw = positive(bandwidth, "bandwidth")
    from scipy.spatial.distance import cdist

    return x, c, -cdist(x, c, "sqeuclidean") / (2.0 * bw * bw), bw


def kde_log_density(x, centres, bandwidth: float) -> np.ndarray:
    """Log density of the isotropic Gaussian KDE ``(1/N) sum_n N(x | c_n, bandwidth^2 I)``.

    Computed as ``logsumexp_n(-||x - c_n||^2 / (2 bandwidth^2)) - log N - (d/2) log(2 pi
    bandwidth^2)``, with no floors.

    Parameters
    ----------
    x : array_like
        ``(M, d)`` evaluation points.
    centres : array_like
        ``(N, d)`` KDE centres (particles).
    bandwidth : float
        Kernel standard deviation (see :func:`kde_bandwidth`).

    Returns
    -------
    numpy.ndarray
        ``(M,)`` float64 log densities. Far from every centre they stay finite (very negative,
        about ``-min_n ||x - c_n||^2 / (2 bandwidth^2)`` plus constants) where summing the kernel
        densities directly underflows to ``log 0 = -inf``.

    Notes
    -----
    The reference code (kclip/DSVGD ``kde``) adds ``1e-9`` to every (unnormalised) kernel term and
    ``1e-10`` to the density before the log. Those floors make the log density flat, and its
    gradient vanish, far from all centres; log-sum-exp replaces them, so the log density keeps
    decreasing and the score (:func:`kde_score`) points to the nearest centres everywhere. The
    reference also puts ``N`` inside the ``(d/2)`` power of its normalising constant; here the KDE
    is a normalised density. Neither constant affects a score.

    References
    ----------
    Kassab & Simeone (2022), Section 5 (KDEs of the global and local particles) and Section 7
    (Gaussian KDE kernel).
    """
    from scipy.special import logsumexp

    x, c, logits, bw = _kde_logits(x, centres, bandwidth)
    n, d = c.shape
    const = np.log(n) + 0.5 * d * np.log(2.0 * np.pi * bw * bw)
    return logsumexp(logits, axis=1) - const


def kde_score(x, centres, bandwidth: float, floor: float = 0.0) -> np.ndarray:
    """Score ``grad_x log KDE(x)`` of the isotropic Gaussian KDE of :func:`kde_log_density`.

    ``grad_x log KDE(x) = sum_n w_n(x) (c_n - x) / bandwidth^2`` with softmax weights
    ``w_n(x) = softmax_n(-||x - c_n||^2 / (2 bandwidth^2))``, stable at any distance.

    With ``floor > 0`` every kernel term ``k_n(x) = exp(-||x - c_n||^2 / (2 bandwidth^2))`` (peak 1)
    is replaced by ``max(k_n(x), floor)``, computed in log space: a term below the floor is a
    constant, so it adds to the density (the softmax normaliser) but not to the gradient. This
    is the reference code's ``1e-9`` floor made stable; far from every centre the score then
    vanishes instead of pulling hard towards the nearest centre. DSVGD needs it: its targets are
    *ratios* of KDEs, and without the floor the ratio's score between two particle clouds grows
    like ``distance / bandwidth^2`` and diverges on second visits (measured in
    :mod:`fedbayes_flwr.algorithms.dsvgd.bundle`).

    Parameters
    ----------
    x : array_like
        ``(M, d)`` evaluation points.
    centres : array_like
        ``(N, d)`` KDE centres.
    bandwidth : float
        Kernel standard deviation.
    floor : float, default 0.0
        Floor of each kernel term relative to its peak (``0``: none; the reference uses ``1e-9``).

    Returns
    -------
    numpy.ndarray
        ``(M, d)`` float64 scores; finite everywhere, and far from all centres about
        ``(c_nearest - x) / bandwidth^2`` (pointing to the nearest centre; the reference code's
        floors make it vanish there instead, see :func:`kde_log_density`).

    References
    ----------
    Kassab & Simeone (2022), Section 5 (scores of the KDE factors in the SVGD targets).
    """
    from scipy.special import softmax

    x, c, logits, bw = _kde_logits(x, centres, bandwidth)
    if floor:
        if not 0.0 < floor < 1.0:
            raise ValueError(f"floor must lie in [0, 1), got {floor}")
        log_floor = float(np.log(floor))
        live = logits > log_floor
        w = softmax(np.where(live, logits, log_floor), axis=1) * live
        return (w @ c - w.sum(axis=1, keepdims=True) * x) / (bw * bw)
    w = softmax(logits, axis=1)
    return (w @ c - x) / (bw * bw)


def log_ratio_score(x, numerators: Sequence[tuple[np.ndarray, float]],
                    denominators: Sequence[tuple[np.ndarray, float]] = (),
                    floor: float = 0.0) -> np.ndarray:
    """Score of a product/ratio of Gaussian KDEs, ``grad_x log(prod_num KDE / prod_den KDE)``.

    The sum of :func:`kde_score` over the numerator KDEs minus the sum over the denominator KDEs:
    the KDE part of the DSVGD targets, e.g. ``q^(i)(theta) / q^(i-1)(theta) * t_k^(i-1)(theta)`` is
    ``numerators=[(global_new, bw), (local_old, bw)], denominators=[(global_old, bw)]``, and the
    cavity ``q^(i-1) / t_k^(i-1)`` is ``[(global_old, bw)] / [(local_old, bw)]`` (to which the
    caller adds the score of the scaled local likelihood).

    Parameters
    ----------
    x : array_like
        ``(M, d)`` evaluation points.
    numerators, denominators : sequence of (centres, bandwidth)
        The KDEs multiplied and divided; each ``centres`` is ``(N_j, d)``.
    floor : float, default 0.0
        Kernel-term floor of every KDE (see :func:`kde_score`).

    Returns
    -------
    numpy.ndarray
        ``(M, d)`` float64 score (zeros when both lists are empty).

    References
    ----------
    Kassab & Simeone (2022), Section 5 (the targets of DSVGD's two SVGD loops); reference code
    kclip/DSVGD ``agent_dsvgd`` (``sv_target = log_qi - log_qi_1 + log_t_prev``).
    """
    x = as_particles(x, "x")
    out = np.zeros_like(x)
    for centres, bw in numerators:
        out = out + kde_score(x, centres, bw, floor)
    for centres, bw in denominators:
        out = out - kde_score(x, centres, bw, floor)
    return out


class KDE(NamedTuple):
    """An isotropic Gaussian KDE: ``(N, d)`` centres and the kernel standard deviation (a
    ``(centres, bandwidth)`` pair, as :func:`log_ratio_score` takes)."""

    centres: np.ndarray
    bandwidth: float


def shrink_kde(kde: KDE, min_bandwidth: float = 0.0) -> KDE:
    """A KDE whose centres are pulled towards their mean.

    A Gaussian KDE has variance ``s^2 + h^2`` per coordinate (``s^2`` the particles' sample
    variance, ``h`` the bandwidth): the kernel adds its own. Scaling the centres' deviations by
    ``a = 1 / sqrt(1 + h^2 / s^2)`` (``s^2`` the mean per-coordinate variance, ``ddof = 1``)
    brings it to ``v = s^4 / (s^2 + h^2) + h^2``: 1.10 s^2 instead of 1.37 s^2 with Scott's rule
    at N = 20, d = 2. Silverman's full correction (the bandwidth scaled by ``a`` too) restores
    ``s^2`` exactly, but SVGD's own under-dispersion at small N (stds 0.8-0.9 of the target's)
    then compounds over a DSVGD pass: measured on ``gaussian-mean`` (10 clients, N = 20), stds
    0.59 of the posterior's after one pass with the full correction, 0.74 with this one, and
    0.66-0.79 with none but the means 0.5-0.8 sd off. DSVGD's sequential targets multiply the KDE
    of the previous global particles in, so any inflation compounds over clients and
    down-weights the earlier ones.

    With ``min_bandwidth > h`` (a ratio's denominator raised to its partner's bandwidth, see
    :func:`ratio_kdes`) the bandwidth becomes ``min_bandwidth`` and the centres are scaled by
    ``sqrt(max(0, (v - min_bandwidth^2) / s^2))``, so the KDE keeps the variance ``v`` where it
    can (it cannot when ``min_bandwidth^2 > v``: the centres then collapse on their mean).

    References
    ----------
    Silverman (1986), "Density Estimation for Statistics and Data Analysis", Section 6.4.1
    (shrunk smoothed bootstrap).
    """
    centres, h = as_particles(kde.centres, "centres"), float(kde.bandwidth)
    if centres.shape[0] < 2:
        return KDE(centres, max(h, min_bandwidth))
    var = float(np.mean(centres.var(axis=0, ddof=1)))
    if not var > 0:
        return KDE(centres, max(h, min_bandwidth))
    a2 = 1.0 / (1.0 + h * h / var)
    if min_bandwidth > h:
        target = a2 * var + h * h
        h = float(min_bandwidth)
        a2 = max(0.0, (target - h * h) / var)
    mean = centres.mean(axis=0)
    return KDE(mean + np.sqrt(a2) * (centres - mean), h)


def ratio_kdes(numerators, denominators, rule: str | float = "auto", paired: bool = True,
               pair_all: bool = False) -> tuple[list[KDE], list[KDE]]:
    """The KDEs of a ratio ``prod KDE(numerators) / prod KDE(denominators)`` of particle sets.

    Each set's bandwidth is :func:`kde_bandwidth` of its own particles under ``rule``. With
    ``paired`` every KDE is shrunk (:func:`shrink_kde`) and the ``j``-th denominator's bandwidth
    raised to at least the ``j``-th numerator's, its partner (every numerator's with
    ``pair_all``; denominators without a partner keep their own). Why: far from every centre
    ``log KDE(x) ~ -||x - c||^2 / (2 h^2)``, so a ratio whose denominator is narrower grows like
    ``||x||^2 (1 / h_den^2 - 1 / h_num^2) / 2`` in the tails, and a DSVGD target is improper
    wherever the likelihood does not dominate (``mixture-1d``: second visits put the particles
    on the prior's edge, KL 0.6-1.8 instead of 0.06); with equal bandwidths it grows at most
    linearly.

    Parameters
    ----------
    numerators, denominators : sequence of array_like
        ``(N_j, d)`` particle sets.
    rule : {"auto"} or float
        See :func:`kde_bandwidth`.
    paired, pair_all : bool
        See above.

    Returns
    -------
    tuple of (list of KDE, list of KDE)
        The numerators' and the denominators' KDEs, in order.

    References
    ----------
    Kassab & Simeone (2022), Section 5 (the KDE ratios in the DSVGD targets).
    """
    num = [KDE(c, kde_bandwidth(c, rule)) for c in numerators]
    den = [KDE(c, kde_bandwidth(c, rule)) for c in denominators]
    if not paired:
        return num, den
    num = [shrink_kde(k) for k in num]
    if pair_all:
        partners = [max((k.bandwidth for k in num), default=0.0)] * len(den)
    else:
        partners = [k.bandwidth for k in num[:len(den)]]
        partners += [0.0] * (len(den) - len(partners))
    return num, [shrink_kde(k, p) for k, p in zip(den, partners, strict=True)]


#: ``smooth_kde``: the kernel's share of each coordinate's variance, ``h^2 = SMOOTH_FRACTION s^2``.
SMOOTH_FRACTION = 0.75


def smooth_kde(centres, fraction: float = SMOOTH_FRACTION, min_bandwidth: float = 0.0) -> KDE:
    """A variance-keeping KDE whose kernel carries ``fraction`` of the particles' variance.

    Bandwidth ``h = sqrt(fraction) s`` (``s^2`` the mean per-coordinate variance, ``ddof = 1``;
    at least ``min_bandwidth``) and the centres pulled towards their mean by ``sqrt(1 - h^2 /
    s^2)``, so the KDE's variance is ``s^2`` exactly (Silverman's shrunk smoothed bootstrap).
    ``fraction -> 1`` is the moment-matched Gaussian, ``-> 0`` the particles themselves. Meant
    for whitened coordinates (every coordinate's variance about ``s^2``). Far from every centre
    ``log KDE ~ -||x - c||^2 / (2 h^2)``: with Scott's ``h`` (``0.73 s`` at ``N = 110, d = 11``)
    a product of KDEs whose clouds do not overlap (P-DSVGD's merge of label-skewed clients)
    weighs each factor with precision ``1 / h^2 = 1.9 / s^2`` instead of ``1 / s^2``.

    References
    ----------
    Silverman (1986), "Density Estimation for Statistics and Data Analysis", Section 6.4.1.
    """
    c = as_particles(centres, "centres")
    if c.shape[0] < 2:
        return KDE(c, max(DEGENERATE_KDE_BANDWIDTH, min_bandwidth))
    var = float(np.mean(c.var(axis=0, ddof=1)))
    if not var > 0:
        return KDE(c, max(DEGENERATE_KDE_BANDWIDTH, min_bandwidth))
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
    h2 = max(fraction * var, min_bandwidth ** 2)
    a = np.sqrt(max(0.0, 1.0 - h2 / var))
    mean = c.mean(axis=0)
    return KDE(mean + a * (c - mean), float(np.sqrt(h2)))


class MatrixKDE(NamedTuple):
    """A Gaussian KDE with a full bandwidth matrix ``H = root root^T``: ``(1/N) sum_n N(x | c_n,
    H)`` (see :func:`matrix_kde`); ``inverse = root^-1`` and ``whitened = centres @ inverse.T``
    are kept (a matrix product per score instead of a triangular solve)."""

    centres: np.ndarray
    root: np.ndarray
    inverse: np.ndarray
    whitened: np.ndarray


def _matrix_kde(centres, root) -> MatrixKDE:
    inverse = np.linalg.inv(root)
    return MatrixKDE(centres, root, inverse, centres @ inverse.T)


def matrix_kde(particles, fraction: float = SMOOTH_FRACTION,
               root: np.ndarray | None = None) -> MatrixKDE:
    """The variance-keeping KDE of :func:`smooth_kde` in the particles' own whitened coordinates:
    bandwidth matrix ``H = fraction * S`` (``S`` the sample covariance with a ``1e-8`` relative
    ridge; diagonal when ``N <= 2 d``) and centres pulled towards their mean by ``sqrt(1 -
    fraction)``, so the KDE's covariance is ``S`` exactly and its kernel follows the cloud's
    scale and correlation.

    References
    ----------
    Silverman (1986), Section 6.4.1 (shrunk smoothed bootstrap) and Section 4.2.1 (a kernel
    shaped by the sample covariance, "sphering").
    """
    c = as_particles(particles)
    n, d = c.shape
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
    cov = np.cov(c, rowvar=False, ddof=1).reshape(d, d) if n > 1 else np.eye(d)
    if n <= 2 * d:
        cov = np.diag(np.diag(cov))
    scale = float(np.mean(np.diag(cov)))
    if not np.isfinite(scale) or scale <= 0:
        return _matrix_kde(c, np.eye(d) if root is None else root)
    cov = cov + 1e-8 * scale * np.eye(d)
    cov = cov + np.diag(np.where(np.diag(cov) > 1e-12 * scale, 0.0, scale))
    mean = c.mean(axis=0)
    return _matrix_kde(mean + np.sqrt(1.0 - fraction) * (c - mean),
                       np.sqrt(fraction) * np.linalg.cholesky(cov) if root is None else root)


def matrix_kde_score(x, kde: MatrixKDE, floor: float = 0.0) -> np.ndarray:
    """Score ``grad_x log KDE(x)`` of a :class:`MatrixKDE` (:func:`kde_score` in the kernel's
    whitened coordinates ``u = root^-1 x``, mapped back by ``root^-T``)."""
    x = as_particles(x, "x")
    su = kde_score(x @ kde.inverse.T, kde.whitened, 1.0, floor)
    return su @ kde.inverse


def matrix_ratio_kdes(numerators, denominators, pair_all: bool = False
                      ) -> tuple[list[MatrixKDE], list[MatrixKDE]]:
    """:func:`matrix_kde` of each set of ``prod KDE(numerators) / prod KDE(denominators)``, the
    ``j``-th denominator with the ``j``-th numerator's kernel where that is wider (by trace) than
    its own (the widest numerator's with ``pair_all``; its own without a partner), so the
    ratio decays in the tails: see :func:`ratio_kdes` for why."""
    num = [matrix_kde(c) for c in numerators]
    if pair_all and num:
        widest = max(num, key=lambda k: float(np.trace(k.root @ k.root.T)))
        partners = [widest.root] * len(denominators)
    else:
        partners = [k.root for k in num[:len(denominators)]]
        partners += [None] * (len(denominators) - len(partners))
    def wide(k):
        return float(np.sum(k.root * k.root))

    den = []
    for c, r in zip(denominators, partners, strict=True):
        own = matrix_kde(c)
        den.append(own if r is None or wide(own) >= float(np.sum(r * r)) else matrix_kde(c, root=r))
    return num, den
