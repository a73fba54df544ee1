"""How much one client's reply may move the server: the bounds the families' ``check`` hooks apply
to replies that are finite and well-formed but absurd (a contribution times 1e300).

The limits come from float64 itself (``eps = 2**-52``), not from tuning:

* :data:`GROWTH_LIMIT` ``= 1 / eps = 2**52``: a Gaussian update may multiply the posterior's
  precision (any direction: the largest generalised eigenvalue of ``P_new`` against ``P_old``)
  by at most this. Past it the current posterior is below float64's resolution of the sum
  ``P_old + P_delta``: the merged posterior is whatever the one client said.
* :data:`SHIFT_LIMIT` ``= sqrt(1 / eps) = 2**26``: a mean may move at most this many current
  standard deviations per coordinate in one update (its KL term ``shift**2 / 2`` then matches
  the precision bound's scale), and a position (a particle, a chain, an iterate) may lie at most
  this many prior standard deviations from the prior mean. There the log prior is below
  ``-2**51`` per coordinate, a log density whose rounding error exceeds one nat.
* A likelihood contribution (AMPS: posterior minus prior in natural parameters) may be at most
  :data:`GROWTH_LIMIT` times the prior's scale per datum (``num_examples`` data).

References
----------
Goldberg (1991), "What every computer scientist should know about floating-point arithmetic",
Section 1.2 (machine epsilon, relative rounding error of a sum).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from fedbayes_flwr.inference import gaussian as G

GROWTH_LIMIT = 2.0 ** 52
SHIFT_LIMIT = 2.0 ** 26


def gaussian_step_error(old: G.NaturalGaussian, new: G.NaturalGaussian,
                        field: str = "delta") -> tuple[str, str] | None:
    """``(field, reason)`` when the proper Gaussian ``new`` moves too far from ``old`` in one update.

    Parameters
    ----------
    old, new : NaturalGaussian
        The current posterior and the posterior after the update (both proper, same layout).
    field : str
        The reply field named in the reason (``<field>.eta2`` for precision, ``.eta1`` for mean).

    Returns
    -------
    tuple of (str, str) or None
        None when the precision grows by at most :data:`GROWTH_LIMIT` in every direction and the
        mean moves at most :data:`SHIFT_LIMIT` current standard deviations per coordinate.

    References
    ----------
    Golub & Van Loan (2013), "Matrix Computations", Section 8.7 (the symmetric-definite
    generalised eigenproblem via Cholesky).
    """
    p_old, p_new = G.precision(old), G.precision(new)
    if old.is_diag:
        growth = float(np.max(p_new / p_old))
        mean_old, var_old = old.eta1 / p_old, 1.0 / p_old
        mean_new = new.eta1 / p_new
    else:
        chol = np.linalg.cholesky(p_old)
        half = scipy.linalg.solve_triangular(chol, p_new, lower=True)
        whitened = scipy.linalg.solve_triangular(chol, half.T, lower=True)
        growth = float(np.max(np.linalg.eigvalsh(0.5 * (whitened + whitened.T))))
        factor = (chol, True)
        mean_old = scipy.linalg.cho_solve(factor, old.eta1)
        var_old = np.diag(scipy.linalg.cho_solve(factor, np.eye(old.dim)))
        mean_new = np.linalg.solve(p_new, new.eta1)
    if not growth <= GROWTH_LIMIT:
        return f"{field}.eta2", (f"multiplies the posterior precision by {growth:.3g} in one "
                                 f"update (limit 2**52 = {GROWTH_LIMIT:.3g})")
    shift = float(np.max(np.abs(mean_new - mean_old) / np.sqrt(var_old)))
    if not shift <= SHIFT_LIMIT:
        return f"{field}.eta1", (f"moves the posterior mean {shift:.3g} posterior standard "
                                 f"deviations in one update (limit 2**26 = {SHIFT_LIMIT:.3g})")
    return None


def position_error(field: str, positions: np.ndarray, prior: G.NaturalGaussian) -> tuple[str, str] | None:
    """``(field, reason)`` when a coordinate of ``positions`` (``(..., d)``) lies more than
    :data:`SHIFT_LIMIT` prior standard deviations from the prior mean, else None.

    References
    ----------
    Goldberg (1991), Section 1.2 (the module docstring: why ``2**26``).
    """
    mean, cov = G.to_moments(prior)
    sd = np.sqrt(cov if prior.is_diag else np.diag(cov))
    far = float(np.max(np.abs(positions - mean) / sd, initial=0.0))
    if not far <= SHIFT_LIMIT:
        return field, (f"a coordinate lies {far:.3g} prior standard deviations from the prior "
                       f"mean (limit 2**26 = {SHIFT_LIMIT:.3g})")
    return None


def contribution_error(arrays, prior_scale: float, num_examples: int) -> str | None:
    """Why a likelihood contribution (its natural-parameter ``arrays``) is too large for
    ``num_examples`` data: an entry above ``GROWTH_LIMIT * num_examples * prior_scale``.

    References
    ----------
    Broderick et al. (2013), "Streaming Variational Bayes", eq. (2), and Campbell & How (2014),
    "Approximate Decentralized Bayesian Inference", eq. (3): a client's contribution
    ``lambda_i - lambda_0`` sums its rows' expected sufficient statistics, so its size scales
    with the row count; Goldberg (1991), Section 1.2 (why ``2**52``).
    """
    limit = GROWTH_LIMIT * max(int(num_examples), 1) * prior_scale
    size = max((float(np.max(np.abs(a), initial=0.0)) for a in arrays), default=0.0)
    if not size <= limit:
        return (f"contribution of size {size:.3g} from {num_examples} examples (limit 2**52 x "
                f"examples x prior scale = {limit:.3g})")
    return None
