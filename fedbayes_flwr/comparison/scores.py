"""One algorithm's figures against the reference posterior.

Posterior figures (``None`` when the reference is ``none`` or the dimensions differ):

- ``mean_error``: ``max_i |m_i - r_i| / s_i``, the worst posterior mean in reference sd
  (``m`` the algorithm's mean, ``r`` and ``s`` the reference's mean and sd);
- ``std_ratio_min``, ``std_ratio_max``: the range of ``sd_i / s_i``;
- ``w1``: ``max_i W1(alg_i, ref_i) / s_i``, the marginal 1-Wasserstein distance of as many of
  the algorithm's draws as the reference holds (``scipy.stats.wasserstein_distance``);
- ``ksd``: the IMQ kernel Stein discrepancy of the algorithm's draws from the target (its
  score only, so it is reported with a ``none`` reference too, for models small enough).

Run figures: the test metrics of the last row (``test_accuracy``, ``test_nll``, ``test_ece`` or
``test_rmse``...), ``bytes`` (down + up, summed over rows), ``exchanges`` (a sampler's own count
of server-client exchanges when it reports one, else the client replies summed over rows),
``updates``, ``wall_s`` and ``outcome``.

References
----------
Villani (2009), "Optimal Transport, Old and New", Chapter 6 (W1 in one dimension); Gorham &
Mackey (2017), "Measuring Sample Quality with Kernels", ICML (the IMQ kernel Stein discrepancy).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.comparison.reference import MAX_NUTS_PARAMS, ReferencePosterior
from fedbayes_flwr.evaluation.sample_quality import ksd_of_posterior, posterior_w1

__all__ = ["KSD_DRAWS", "score_run"]

KSD_DRAWS = 500
"""Draws of each posterior for its KSD (the cost is O(KSD_DRAWS^2 P))."""


def _finite(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def _run_figures(result: dict) -> dict:
    history = list(result.get("history") or [])
    final = dict(result.get("final") or {})
    diagnostics = (history[-1].get("diagnostics") or {}) if history else {}
    exchanges = diagnostics.get("exchanges")
    if exchanges is None:
        exchanges = sum(len(row.get("clients") or []) for row in history)
    out = {"outcome": result.get("outcome"), "updates": len(history),
           "bytes": int(sum(int(row.get("bytes_down", 0)) + int(row.get("bytes_up", 0))
                            for row in history)),
           "exchanges": int(exchanges)}
    for key, value in sorted(final.items()):
        if key.startswith("test_") and _finite(value) is not None:
            out[key] = float(value)
    for key in ("ess_min", "rhat_max"):
        if _finite(diagnostics.get(key)) is not None:
            out[key] = float(diagnostics[key])
    return out


def score_run(result: dict, posterior, reference: ReferencePosterior, experiment,
              wall_s: float | None = None) -> dict:
    """The figures of one run (its ``result.json`` dict and posterior) against ``reference``.

    Parameters
    ----------
    result : dict
        The run's ``result.json``.
    posterior : fedbayes_flwr.inference.posterior.Posterior or None
        Its posterior (None when it recorded none).
    reference : ReferencePosterior
        From :func:`~fedbayes_flwr.comparison.reference.reference_posterior`.
    experiment : fedbayes_flwr.runtime.experiment.Experiment
        The data set, model and prior (for the KSD).
    wall_s : float, optional
        Wall seconds of the run as measured by the caller (else the last row's ``elapsed_s``).

    Returns
    -------
    dict
        See the module docstring; posterior figures are None where they cannot be computed,
        with ``note`` saying why.

    References
    ----------
    Villani (2009), Chapter 6; Gorham & Mackey (2017), ICML.
    """
    out: dict = _run_figures(result)
    history = result.get("history") or []
    out["wall_s"] = float(wall_s if wall_s is not None
                          else (history[-1].get("elapsed_s", 0.0) if history else 0.0))
    out.update({"mean_error": None, "std_ratio_min": None, "std_ratio_max": None, "w1": None,
                "ksd": None})
    if posterior is None:
        out["note"] = "no posterior recorded"
        return out
    out["posterior"] = type(getattr(posterior, "wrapped", posterior)).__name__
    if reference.kind != "none":
        assert reference.mean is not None and reference.std is not None
        assert reference.draws is not None
        if int(posterior.dim) != reference.mean.shape[0]:
            out["note"] = (f"posterior has {posterior.dim} parameters, the reference "
                           f"{reference.mean.shape[0]}: not compared")
            return out
        mean = np.asarray(posterior.mean(), dtype=np.float64)
        std = np.asarray(posterior.std(), dtype=np.float64)
        err = np.abs(mean - reference.mean) / reference.std
        ratio = std / reference.std
        w1 = np.asarray(posterior_w1(posterior, reference.draws), dtype=np.float64)
        out.update({"mean_error": float(np.max(err)), "std_ratio_min": float(np.min(ratio)),
                    "std_ratio_max": float(np.max(ratio)),
                    "w1": float(np.max(w1 / reference.std)),
                    "mean_error_per_param": err.tolist(), "std_ratio_per_param": ratio.tolist()})
    if int(posterior.dim) <= MAX_NUTS_PARAMS and hasattr(experiment.model, "log_density_and_grad"):
        data = experiment.dataset
        try:
            out["ksd"] = _finite(ksd_of_posterior(posterior, experiment.model, data.x_train,
                                                  data.y_train, experiment.prior, n=KSD_DRAWS))
        except (ValueError, NotImplementedError, TypeError) as err:  # no score for this model
            out["ksd_note"] = f"no KSD: {err}"
    return out
