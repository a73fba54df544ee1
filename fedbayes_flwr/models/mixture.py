"""The 1-D Gaussian-mixture toy of DSVGD: each data row is one agent's local likelihood.

``mixture-1d``
    ``theta`` is a scalar (``param_dim = 1`` whatever the number of data columns). A data row of
    ``3 J`` numbers ``(w_1, m_1, v_1, ..., w_J, m_J, v_J)`` is the likelihood factor
    ``sum_j w_j N(theta | m_j, v_j)`` (``v_j`` a variance; a component with ``w_j = 0``
    contributes nothing, its mean and variance are ignored; every row needs one ``w_j > 0``).
    The prior is uniform on ``[-6, 6]``.

The rows are likelihood specifications, not observations: the dataset ``mixture-1d`` holds the
paper's two agents, and metrics compare the posterior with the exact global posterior ``q_opt``
by quadrature (:func:`fedbayes_flwr.models.mixture.mixture_1d_kl`).

References
----------
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein Variational
Gradient Descent", Section 7.1 and Figs. 2-3: ``p_1(theta) = p_0(theta) N(theta | 1, 4)``,
``p_2(theta) = p_0(theta) (N(theta | -3, 1) + N(theta | 3, 2))``, ``p_0 = U(-6, 6)``.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference.kde import kde_bandwidth, kde_log_density
from fedbayes_flwr.models.base import Model, Prediction

# ---- the exact global posterior of the 1-D Gaussian-mixture toy (DSVGD), on a grid ----------

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


class MixtureLikelihood1D(Model):
    """Scalar ``theta`` under a uniform prior on ``[-6, 6]`` and Gaussian-mixture likelihood rows.

    ``log_likelihood_rows_tf`` is ``log sum_j w_j N(theta | m_j, v_j)`` per row, computed with
    log-sum-exp (zero-weight components enter as ``-inf`` terms, so rows that have them stay
    finite and so does the gradient).

    Prior: the model's own prior (``gaussian_prior = False``) is ``U(-6, 6)``:
    :meth:`log_prior_tf` is ``-log 12`` inside ``[-6, 6]`` (end points included) and ``-inf``
    outside, with zero gradient everywhere (DSVGD projects particles back into
    :attr:`support`, so only the inside matters; ``-inf`` makes an outside proposal of an
    accept/reject sampler impossible rather than merely unlikely). :meth:`prior` returns the
    Gaussian stand-in ``N(0, prior_scale^2)`` of the base class, used only by Gaussian-family
    algorithms (PVI, global VI); the benchmark sets ``prior-scale = sqrt(12)``, so that the
    stand-in has the uniform's variance ``12^2 / 12 = 12``.

    References
    ----------
    Kassab & Simeone (2022), Section 7.1 (the toy) and Fig. 3 (``KL(q || q_opt)``).
    """

    name = "mixture-1d"
    target = "none"
    synthetic = "mixture-1d"
    has_targets = False
    gaussian_prior = False
    support = MIXTURE_1D_SUPPORT

    def param_dim(self, num_features: int) -> int:
        return 1

    def log_likelihood_rows_tf(self, theta, x, y=None):
        """``log sum_j w_ij N(theta_s | m_ij, v_ij)``, shape ``(S, n)``, for rows ``x`` ``(n, 3 J)``."""
        import tensorflow as tf

        w, m, v = x[:, 0::3], x[:, 1::3], x[:, 2::3]  # (n, J)
        positive = w > 0
        v = tf.where(positive, v, tf.ones_like(v))  # a zero-weight component's v is ignored
        log_w = tf.where(positive, tf.math.log(tf.where(positive, w, tf.ones_like(w))),
                         tf.constant(-np.inf, x.dtype))
        t = theta[:, :1, None]  # (S, 1, 1)
        comp = (log_w - 0.5 * tf.math.log(2.0 * np.pi * v)
                - 0.5 * (t - m[None]) ** 2 / v[None])  # (S, n, J)
        return tf.reduce_logsumexp(comp, axis=2)

    def log_prior_tf(self, theta, prior=None):
        """Uniform ``U(low, high)`` on every coordinate: ``-P log(high - low)`` inside, ``-inf``
        outside (the Gaussian ``prior`` argument is ignored); zero gradient."""
        import tensorflow as tf

        low, high = self.support
        theta = tf.convert_to_tensor(theta, tf.float64)
        inside = tf.reduce_all((theta >= low) & (theta <= high), axis=1)
        p = tf.cast(tf.shape(theta)[1], tf.float64)
        return tf.where(inside, -p * np.log(high - low), tf.constant(-np.inf, tf.float64))

    def predictive(self, posterior, x) -> Prediction:
        raise NotImplementedError(
            "mixture-1d has no predictive: its data rows are likelihood specifications, not "
            "observations; use metrics() (KL to the exact posterior)")

    def log_q_on_grid(self, posterior, grid: np.ndarray) -> np.ndarray:
        """Log density of the posterior's 1-D density estimate ``q`` at ``grid`` (unnormalised on
        the truncated range: :func:`~fedbayes_flwr.models.mixture.mixture_1d_kl` renormalises it).

        A Gaussian posterior (``posterior.gaussian``) is its own density ``N(mean, std^2)``; any
        other (particles, samples) the Gaussian KDE of ``posterior.draws()`` (all stored draws of
        a :class:`~fedbayes_flwr.inference.posterior.SamplePosterior`) with bandwidth
        ``kde_bandwidth(particles, "auto")`` (Scott's rule).
        """

        grid = np.asarray(grid, dtype=np.float64).reshape(-1)
        if posterior.gaussian:
            mean, std = float(posterior.mean()[0]), float(posterior.std()[0])
            return -0.5 * ((grid - mean) / std) ** 2 - np.log(std)
        particles = np.asarray(posterior.draws(), dtype=np.float64)[:, :1]
        bandwidth = kde_bandwidth(particles, "auto")
        return kde_log_density(grid[:, None], particles, bandwidth)

    def metrics(self, posterior, x, y=None) -> tuple[dict[str, float], None]:
        """``{"kl": KL(q || q_opt), "mean": E_q[theta]}`` and no reliability diagram.

        ``q_opt ∝ U(-6, 6) prod_i (row i's likelihood)`` over the rows ``x``; ``q`` is
        :meth:`log_q_on_grid` truncated to ``[-6, 6]`` and renormalised there. Both are
        evaluated by the trapezoid rule on :func:`~fedbayes_flwr.models.mixture.mixture_1d_grid`
        (4001 points); ``mean`` is the mean of that truncated ``q``.

        References
        ----------
        Kassab & Simeone (2022), Section 7.1, Fig. 3.
        """
        grid = mixture_1d_grid(self.support)
        log_q = self.log_q_on_grid(posterior, grid)
        kl = mixture_1d_kl(log_q, x, grid)
        q = np.exp(log_q - np.max(log_q))
        mean = float(np.trapezoid(grid * q, grid) / np.trapezoid(q, grid))
        return {"kl": kl, "mean": mean}, None
