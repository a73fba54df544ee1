"""MCMC diagnostics through ArviZ: sample posteriors as ``InferenceData``, ESS and R-hat.

A posterior with draws (:class:`~fedbayes_flwr.inference.posterior.SamplePosterior` and its
:class:`~fedbayes_flwr.inference.posterior.TracePosterior`: PDMC, decentralized HMC and the other
samplers) exports as an ArviZ ``InferenceData`` with :func:`to_inference_data`, so every ArviZ
diagnostic and plot applies to it (``arviz.summary``, ``arviz.plot_trace``, ``arviz.ess``,
``arviz.rhat``, ``arviz.plot_rank`` ...). A run's posterior reads back with
``fedbayes_flwr.load(output_dir).posterior`` and exports with its ``to_arviz()``, or
``to_inference_data(load_posterior("posterior.npz"))``. :func:`mcmc_summary` gives the
rank-normalised bulk and tail ESS and R-hat per coordinate that the run's ``trace.png`` shows.

ArviZ is imported when these functions are called, not when this module is imported.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = ["import_arviz", "mcmc_summary", "to_inference_data"]


def import_arviz() -> Any:
    """``arviz``, imported without its import-time FutureWarning (ArviZ 0.x announcing 1.0's
    refactor: this package pins ``arviz<1``, whose ``InferenceData`` it uses)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def _chains(posterior: Any) -> np.ndarray:
    chains = getattr(posterior, "chains", None)
    if chains is None:
        raise ValueError(f"{type(posterior).__name__} has no draws (no 'chains'): only sample "
                         f"posteriors (SamplePosterior, TracePosterior) export to ArviZ")
    chains = np.asarray(chains, dtype=np.float64)
    if chains.ndim != 3:
        raise ValueError(f"chains must have shape (chains, draws, d), got {chains.shape}")
    return chains


def to_inference_data(posterior: Any, var_name: str = "theta") -> Any:
    """The draws of a sample posterior as an ArviZ ``InferenceData``.

    Parameters
    ----------
    posterior : SamplePosterior
        A posterior with ``chains`` of shape ``(C, N, d)`` (chains kept apart, in draw order).
    var_name : str, optional
        Name of the parameter vector in the ``posterior`` group.

    Returns
    -------
    arviz.InferenceData
        Group ``posterior`` with variable ``var_name`` of dims ``(chain, draw, f"{var_name}_dim")``
        (coordinates ``0 .. d-1``, the library's parameter order). A
        :class:`~fedbayes_flwr.inference.posterior.TracePosterior`'s extra arrays (a PDMP skeleton,
        every agent's iterates) are not part of it: they are not draws of the target.

    Raises
    ------
    ValueError
        The posterior holds no draws (a Gaussian or structured posterior).

    References
    ----------
    Kumar, Carroll, Hartikainen & Martin (2019), "ArviZ a unified library for exploratory
    analysis of Bayesian models in Python", JOSS 4(33) (the ``InferenceData`` layout).
    """
    az = import_arviz()
    chains = _chains(posterior)
    dim = f"{var_name}_dim"
    with warnings.catch_warnings():  # "more chains than draws": the layout is explicit here
        warnings.filterwarnings("ignore", message="More chains", category=UserWarning)
        return az.from_dict(posterior={var_name: chains}, dims={var_name: [dim]},
                            coords={dim: np.arange(chains.shape[2])})


def mcmc_summary(posterior: Any) -> dict[str, np.ndarray]:
    """Bulk ESS, tail ESS and R-hat per coordinate (ArviZ's rank-normalised estimators).

    Parameters
    ----------
    posterior : SamplePosterior
        A posterior with ``chains`` of shape ``(C, N, d)``.

    Returns
    -------
    dict of str to numpy.ndarray
        ``"ess_bulk"``, ``"ess_tail"``, ``"r_hat"``, each of shape ``(d,)``. With one chain
        R-hat is the split-chain R-hat of its two halves.

    Notes
    -----
    These are the estimators of Vehtari et al. (2021); ``SamplePosterior.ess`` and ``.rhat``
    (TensorFlow Probability's, in ``result.json``) are Geyer's initial-sequence ESS and the
    classic Gelman-Rubin R-hat, so the two disagree slightly.

    References
    ----------
    Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-normalization, folding, and
    localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2),
    Sections 3-4.
    """
    az = import_arviz()
    idata = to_inference_data(posterior)
    out = {"ess_bulk": az.ess(idata, method="bulk"), "ess_tail": az.ess(idata, method="tail"),
           "r_hat": az.rhat(idata)}
    return {k: np.asarray(v["theta"].values, dtype=np.float64).reshape(-1) for k, v in out.items()}
