"""Monte Carlo checks of sampled moments against exact ones, with their power checks.

Shared by the samplers' tests that compare pooled chains with a known (e.g. conjugate Gaussian)
posterior. The tolerance is ``width`` Monte Carlo standard errors from the effective sample size
of independent chains (:meth:`fedbayes_flwr.inference.posterior.SamplePosterior.ess`, the
cross-chain Geyer estimator): for the mean ``sqrt(var / ESS)`` per coordinate, for the variance
ratio ``sqrt(2 / ESS')`` with ``ESS'`` that of the squared deviations (a Gaussian's squared
deviation has variance ``2 var^2``). A two-sided 4-sigma band is exceeded with probability 6e-5
per coordinate. Power: the same bands around a target moved by a stated shift must be missed in
every coordinate (a shift of 8 MCSE or more is caught whatever the draw).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference.posterior import SamplePosterior


def mcse_checks(chains, mean, var, mean_shift: float | None = None,
                var_scale: float | None = None, width: float = 4.0) -> dict:
    """Assert the pooled mean and variance of ``chains`` within ``width`` MCSE of ``mean`` and
    ``var``, and (power) that they miss the targets moved by ``mean_shift`` posterior sd and
    scaled by ``var_scale``.

    Parameters
    ----------
    chains : numpy.ndarray
        ``(K, T, d)``: ``K`` independent chains of ``T`` draws.
    mean, var : numpy.ndarray
        ``(d,)``: the exact mean and (marginal) variance.
    mean_shift : float, optional
        Power check: ``|estimate - (mean + mean_shift sqrt(var))|`` must exceed the mean's band
        in every coordinate.
    var_scale : float, optional
        Power check: ``|variance / (var_scale var) - 1|`` must exceed the variance's band in
        every coordinate.
    width : float
        The band in MCSE (default 4).

    Returns
    -------
    dict
        ``ess``, ``sq_ess`` (per coordinate); ``mean_z`` (mean error in MCSE), ``var_z``
        (variance-ratio error in relative MCSE); ``mean_band`` (the band in posterior sd) and
        ``var_band`` (relative), for the tests to print.
    """
    chains = np.asarray(chains, dtype=np.float64)
    mean, var = np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)
    flat = chains.reshape(-1, chains.shape[-1])
    ess = SamplePosterior(chains).ess()
    sq_ess = SamplePosterior((chains - flat.mean(0)) ** 2).ess()
    mcse = np.sqrt(var / ess)
    rel_mcse = np.sqrt(2 / sq_ess)
    est_mean, est_var = flat.mean(0), flat.var(0)
    out = {"ess": ess, "sq_ess": sq_ess, "mean_z": (est_mean - mean) / mcse,
           "var_z": (est_var / var - 1) / rel_mcse, "mean_band": width / np.sqrt(ess),
           "var_band": width * rel_mcse}
    assert np.all(np.abs(est_mean - mean) <= width * mcse), out
    assert np.all(np.abs(est_var / var - 1) <= width * rel_mcse), out
    if mean_shift is not None:
        shifted = mean + mean_shift * np.sqrt(var)
        assert np.all(np.abs(est_mean - shifted) > width * mcse), ("power: mean", out)
    if var_scale is not None:
        assert np.all(np.abs(est_var / (var_scale * var) - 1) > width * rel_mcse), (
            "power: variance", out)
    return out
