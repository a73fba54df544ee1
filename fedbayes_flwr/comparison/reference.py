"""The reference posterior a comparison scores every algorithm against.

Three kinds, chosen by :func:`reference_posterior` with ``kind="auto"``:

- ``exact``: the model is conjugate (``likelihood_factor`` is not None): the closed-form
  Gaussian posterior on the pooled training rows, no sampling; its draws (for W1) are exact
  draws of that Gaussian.
- ``nuts``: the model has at most :data:`MAX_NUTS_PARAMS` parameters and the pooled data at
  most :data:`MAX_NUTS_WORK` rows x parameters: a long NUTS run
  (:func:`fedbayes_flwr.evaluation.reference.nuts_reference`, cached on disk), with its ESS and
  R-hat checked against :data:`MIN_ESS` and :data:`MAX_RHAT` and reported.
- ``none``: the model is too large for NUTS (or has no TensorFlow density); the reason is said
  plainly and only predictive metrics are compared.

References
----------
Hoffman & Gelman (2014), "The No-U-Turn Sampler", JMLR 15 (Algorithm 6); Bishop (2006), "Pattern
Recognition and Machine Learning", Section 3.3 (the conjugate Gaussian posterior).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.evaluation.reference import nuts_reference
from fedbayes_flwr.evaluation.sample_quality import w1_noise_floor
from fedbayes_flwr.inference.posterior import GaussianPosterior
from fedbayes_flwr.models import exact_posterior

__all__ = ["w1_floor", "KINDS", "MAX_NUTS_PARAMS", "MAX_NUTS_WORK", "MAX_RHAT", "MIN_ESS", "NUTS_SETTINGS",
           "ReferencePosterior", "reference_posterior"]

KINDS = ("auto", "exact", "nuts", "none")
MAX_NUTS_PARAMS = 100
"""NUTS is tried up to this many parameters (its cost per draw grows about as P^(5/4) leapfrog
steps of a full pass over the data)."""
MAX_NUTS_WORK = 5_000_000
"""... and up to this many rows x parameters per gradient evaluation."""
MIN_ESS = 400.0
"""A NUTS reference with a smaller minimum ESS is reported as not converged (its Monte-Carlo
error in a mean would exceed 0.05 posterior sd)."""
MAX_RHAT = 1.01
"""A NUTS reference with a larger maximum R-hat is reported as not converged (Vehtari et al.
2021's threshold)."""
NUTS_SETTINGS = {"num_chains": 4, "num_draws": 1000, "num_warmup": 500, "seed": 0}
"""The reference run: 4 chains x 1000 kept draws after 500 adaptation steps."""
EXACT_DRAWS = 4000
"""Draws of an exact Gaussian reference used for the marginal W1 (as many as NUTS keeps)."""
EXACT_SEED = np.array([8128, 3], dtype=np.int32)


class ReferencePosterior(NamedTuple):
    """What a comparison scores against.

    Attributes
    ----------
    kind : str
        ``exact``, ``nuts`` or ``none``.
    mean, std : numpy.ndarray or None
        ``(P,)`` moments (None for ``none``).
    draws : numpy.ndarray or None
        ``(S, P)`` draws (exact draws of the Gaussian, or the NUTS chains pooled).
    diagnostics : dict
        ``ess_min``, ``rhat_max``, ``converged``, ``divergences``, ``seconds``, ``from_cache``
        for NUTS; ``w1_floor`` (:func:`w1_floor`) for both; ``reason`` for ``none``.
    """

    kind: str
    mean: np.ndarray | None
    std: np.ndarray | None
    draws: np.ndarray | None
    diagnostics: dict


def w1_floor(draws: np.ndarray, std: np.ndarray, repeats: int = 50) -> float:
    """The largest marginal W1 / sd that a perfect sampler's ``S`` draws show against the ``S``
    reference draws (the median over random splits): the table's ``w1`` cannot go below it.

    Computed on halves of the reference (:func:`~fedbayes_flwr.evaluation.sample_quality.w1_noise_floor`
    with ``S / 2`` against ``S / 2``) and scaled by ``1 / sqrt(2)``: the empirical W1 between two
    independent sets of sizes ``a`` and ``b`` scales as ``sqrt(1/a + 1/b)`` (del Barrio, Gine &
    Matran 1999), ``sqrt(4 / S)`` for the halves and ``sqrt(2 / S)`` for ``S`` against ``S``.
    """
    floor = w1_noise_floor(draws, draws.shape[0] // 2, np.random.default_rng(0), repeats)
    return float(np.max(np.median(floor, axis=0) / std) / np.sqrt(2.0))


def _none(reason: str) -> ReferencePosterior:
    return ReferencePosterior("none", None, None, None, {"reason": reason})


def _pooled(experiment) -> tuple[np.ndarray, np.ndarray | None]:
    data = experiment.dataset
    return np.asarray(data.x_train, dtype=np.float64), data.y_train


def reference_posterior(experiment, kind: str = "auto", cache_dir: str | None = None,
                        nuts_settings: dict | None = None) -> ReferencePosterior:
    """The reference posterior of ``experiment``'s model on its pooled training rows.

    Parameters
    ----------
    experiment : fedbayes_flwr.runtime.experiment.Experiment
        Any run's experiment (data, model, prior); the partition does not matter.
    kind : {"auto", "exact", "nuts", "none"}
        ``auto``: exact when the model is conjugate, else NUTS when the model is small enough
        (:data:`MAX_NUTS_PARAMS`, :data:`MAX_NUTS_WORK`), else none. ``exact`` or ``nuts``
        force that kind (a ValueError when the model has no closed form for ``exact``).
    cache_dir : str, optional
        Where NUTS draws are cached (default :func:`fedbayes_flwr.evaluation.reference.default_cache_dir`).
    nuts_settings : dict, optional
        Overrides of :data:`NUTS_SETTINGS`.

    Returns
    -------
    ReferencePosterior

    References
    ----------
    Hoffman & Gelman (2014), JMLR 15, Algorithm 6 (NUTS); Bishop (2006), Section 3.3.
    """
    if kind not in KINDS:
        raise ValueError(f"reference kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "none":
        return _none("not asked for (--reference none)")
    model, x, y = experiment.model, *_pooled(experiment)
    prior = experiment.prior
    conjugate = model.likelihood_factor(x[:1], None if y is None else y[:1]) is not None
    if kind == "exact" or (kind == "auto" and conjugate and prior is not None):
        if not conjugate:
            raise ValueError(f"model {model.name!r} has no closed-form posterior: use "
                             f"reference 'nuts' or 'auto'")
        post = GaussianPosterior(exact_posterior(model, prior, x, y))
        exact_draws = np.asarray(post.sample(EXACT_SEED, EXACT_DRAWS), np.float64)
        return ReferencePosterior("exact", post.mean(), post.std(), exact_draws,
                                  {"rows": int(x.shape[0]),
                                   "w1_floor": w1_floor(exact_draws, post.std())})
    params = int(model.param_dim(x.shape[1]))
    if kind == "auto" and params > MAX_NUTS_PARAMS:
        return _none(f"model {model.name!r} has {params} parameters, more than NUTS's "
                     f"{MAX_NUTS_PARAMS} here: predictive metrics only")
    if kind == "auto" and params * x.shape[0] > MAX_NUTS_WORK:
        return _none(f"{x.shape[0]} rows x {params} parameters exceed NUTS's {MAX_NUTS_WORK} "
                     f"per gradient here: predictive metrics only")
    settings = {**NUTS_SETTINGS, **(nuts_settings or {})}
    ref = nuts_reference(model, x, y, prior, cache_dir=cache_dir, **settings)
    draws = ref.draws
    ess_min, rhat_max = float(np.min(ref.ess)), float(np.max(ref.rhat))
    diagnostics = {"ess_min": ess_min, "rhat_max": rhat_max,
                   "divergences": int(ref.info.get("divergences", 0)),
                   "converged": bool(ess_min >= MIN_ESS and rhat_max <= MAX_RHAT
                                     and not ref.info.get("divergences", 0)),
                   "seconds": float(ref.info.get("seconds", 0.0)), "from_cache": ref.from_cache,
                   "cache_file": ref.path, "rows": int(x.shape[0]), **settings}
    std = draws.std(axis=0, ddof=1)
    diagnostics["w1_floor"] = w1_floor(draws, std)
    return ReferencePosterior("nuts", draws.mean(axis=0), std, draws, diagnostics)
