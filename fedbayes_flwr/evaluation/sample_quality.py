"""Sample quality: distances between a posterior (or a sample) and a reference posterior.

* :func:`marginal_w1`: the per-coordinate 1-Wasserstein distance between two samples (the one
  W1 of the project; :func:`posterior_w1` applies it to draws from any posterior), and the
  calibration of a W1 tolerance from the reference itself (:func:`w1_noise_floor`,
  :func:`w1_bound`);
* :func:`kernel_stein_discrepancy` (IMQ kernel) and :func:`ksd_of_posterior`.

References
----------
Villani (2009), "Optimal Transport, Old and New", Chapter 6; Gorham & Mackey (2017), "Measuring
Sample Quality with Kernels", ICML.
"""

from __future__ import annotations

import numpy as np

__all__ = ["KSD_SEED", "W1_SEED", "kernel_stein_discrepancy", "ksd_of_posterior", "marginal_w1",
           "posterior_w1", "w1_bound", "w1_noise_floor"]

#: Seeds of the posterior draws of :func:`posterior_w1` and :func:`ksd_of_posterior`.
W1_SEED = np.array([4242, 17], dtype=np.int32)
KSD_SEED = np.array([5151, 23], dtype=np.int32)


def posterior_w1(posterior, reference_draws: np.ndarray, seed: np.ndarray = W1_SEED,
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
    ref = np.asarray(reference_draws, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[0] < 1 or ref.shape[1] != posterior.dim:
        raise ValueError(f"reference_draws must have shape (m, {posterior.dim}), got {ref.shape}")
    draws = np.asarray(posterior.sample(seed, ref.shape[0] if n is None else int(n)),
                       dtype=np.float64)
    return marginal_w1(draws, ref)


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


def _flat(samples) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float64)
    if a.ndim == 1:
        return a[:, None]
    return a.reshape(-1, a.shape[-1])


def marginal_w1(samples_a, samples_b) -> np.ndarray:
    """The 1-Wasserstein distance between the marginals of two samples, per coordinate.

    Parameters
    ----------
    samples_a, samples_b : array_like
        ``(..., d)`` draws (chains are pooled: every axis but the last is flattened); a 1-D
        array is one coordinate.

    Returns
    -------
    numpy.ndarray
        ``(d,)``: ``W1`` between the empirical marginals of coordinate ``j``
        (``scipy.stats.wasserstein_distance``, the area between the two empirical CDFs).

    References
    ----------
    Villani (2009), "Optimal Transport, Old and New", Chapter 6; the seed paper, Section 6
    (marginal W1 to a long reference run).
    """
    from scipy.stats import wasserstein_distance

    a, b = _flat(samples_a), _flat(samples_b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"dimensions differ: {a.shape[1]} and {b.shape[1]}")
    return np.array([wasserstein_distance(a[:, j], b[:, j]) for j in range(a.shape[1])])


def w1_noise_floor(reference, n_draws, rng: np.random.Generator,
                   repeats: int = 200) -> np.ndarray:
    """The marginal W1 that a perfect sampler with ``n_draws`` independent draws would show.

    Each repeat splits the pooled reference at random: ``n_draws`` draws (without replacement:
    the first ``n_draws`` of one ``rng.permutation`` of the ``R`` pooled draws per repeat, shared
    by the coordinates; approximately i.i.d. from the posterior when the reference's own ESS is
    much larger than ``n_draws``) against the other ``R - n_draws``, and measures the same
    distance as :func:`marginal_w1` between the two (computed on the sorted reference, without
    a sort per split). A run with
    effective sample size ``n_draws`` compared with the same reference has the same Monte Carlo
    error (its draws' and the reference's), so its distance is on the scale of these.

    Parameters
    ----------
    reference : array_like
        ``(..., d)`` reference draws (pooled), e.g. :attr:`Reference.draws`.
    n_draws : int or array_like
        The run's ESS: one number, or ``(d,)`` (per coordinate); rounded down, at least 1 and
        less than the number of reference draws.
    rng : numpy.random.Generator
    repeats : int

    Returns
    -------
    numpy.ndarray
        ``(repeats, d)`` distances.

    References
    ----------
    The seed paper, Section 6 (W1 to a reference sample); del Barrio, Gine & Matran (1999),
    "Central limit theorems for the Wasserstein distance between the empirical and the true
    distributions", Annals of Probability 27 (the ``n^{-1/2}`` scale of the empirical W1).
    """
    ref = _flat(reference)
    total, d = ref.shape
    n = np.broadcast_to(np.floor(np.asarray(n_draws, dtype=np.float64)), (d,)).astype(np.int64)
    n = np.maximum(n, 1)
    if np.any(n >= total):
        raise ValueError(f"n_draws {n.max()} must be below the {total} reference draws")
    # W1 between two empirical distributions on the sorted pooled points s_0 <= ... <= s_{R-1}:
    # sum_k |F_a(s_k) - F_b(s_k)| (s_{k+1} - s_k), the same integral scipy computes, without a
    # sort per split
    order = np.argsort(ref, axis=0, kind="stable")
    gaps = np.ascontiguousarray(np.diff(np.take_along_axis(ref, order, axis=0), axis=0).T)
    order = np.ascontiguousarray(order[:-1].T)  # (d, R - 1): the last point bounds no gap
    below = np.arange(1, total)
    out = np.empty((repeats, d))
    rank, positions = np.empty(total, np.int64), np.arange(total)
    for r in range(repeats):
        rank[rng.permutation(total)] = positions  # the split: draws perm[:n] vs the rest
        for j in range(d):
            picked = np.cumsum(rank[order[j]] < n[j])
            diff = picked / n[j] - (below - picked) / (total - n[j])
            out[r, j] = np.dot(np.abs(diff), gaps[j])
    return out


def w1_bound(reference, n_draws, rng: np.random.Generator, repeats: int = 200,
             quantile: float = 0.99, factor: float = 3.0) -> np.ndarray:
    """``factor`` times the ``quantile`` of :func:`w1_noise_floor` over ``repeats``, per coordinate.

    The factor covers what the floor does not: ``W1`` depends on the whole marginal while the
    ESS is the mean's (tails and quantiles of an MCMC run mix more slowly), and the ESS is
    itself estimated. ``W1`` falls as ``n^{-1/2}``, so a factor ``c`` tolerates an effective size
    for the marginal ``c^2`` times smaller than the ESS.

    Returns
    -------
    numpy.ndarray
        ``(d,)``.
    """
    floor = w1_noise_floor(reference, n_draws, rng, repeats)
    return factor * np.quantile(floor, quantile, axis=0)
