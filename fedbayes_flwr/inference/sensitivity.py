r"""Rate sensitivities: how much one record (added or removed) can change a model's event rates.

A model offers :meth:`fedbayes_flwr.models.Model.rate_sensitivity` from these bounds; the
privacy guarantee that uses them (Fed-PDMC's refreshment rate) lives in
:mod:`fedbayes_flwr.algorithms.pdmc.privacy`. numpy only.

References
----------
The seed paper "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Theorem 5.1 (the condition ``|lambda(x, v) - lambda~(x, v)| <= K``); Bierkens, Fearnhead &
Roberts (2019), Section 3.2 (the logistic rates).
"""

from __future__ import annotations

import numpy as np

NEIGHBOURS = ("add-remove", "replace")


class UnboundedSensitivityError(ValueError):
    """No finite ``K`` bounds the change of a model's event rates between neighbouring data."""


def feature_bound(x, clip=None) -> np.ndarray:
    """Per-feature bound ``B_i >= |xi_ni|`` for :func:`logistic_sensitivity`.

    Parameters
    ----------
    x : array_like
        ``(n, p)`` features (without the intercept column).
    clip : float or array_like, optional
        A public bound the features are clipped to (:func:`clip_features`): returned as is
        (broadcast to ``p``), and checked against ``x``. ``None``: the maximum of ``|x|`` over
        the rows -- which is itself computed from the private data, so the guarantee then holds
        only if that bound is treated as public (prefer a data-independent ``clip``).

    Returns
    -------
    numpy.ndarray
        ``(p,)``.
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if clip is None:
        return np.max(np.abs(x), axis=0) if x.shape[0] else np.zeros(x.shape[1])
    bound = np.broadcast_to(np.asarray(clip, dtype=np.float64), (x.shape[1],)).copy()
    if np.any(bound < 0) or not np.all(np.isfinite(bound)):
        raise ValueError(f"clip: must be finite and >= 0, got {clip!r}")
    if x.shape[0] and np.any(np.abs(x) > bound):
        raise ValueError("features exceed the clip bound: clip them first (clip_features)")
    return bound


def clip_features(x, clip) -> np.ndarray:
    """``x`` clipped elementwise to ``[-clip, clip]`` (``clip`` scalar or per feature, public)."""
    bound = np.asarray(clip, dtype=np.float64)
    return np.clip(np.asarray(x, dtype=np.float64), -bound, bound)


def logistic_sensitivity(bound, *, intercept: bool = True,
                         neighbours: str = "add-remove") -> np.ndarray:
    r"""Per-coordinate ``K_i`` of logistic regression's Zig-Zag rates.

    A record ``(xi_n, eta_n)`` contributes ``xi_ni (sigma(xi_n . x) - eta_n)`` to ``d_i U_m(x)``;
    ``|sigma - eta| < 1`` and ``(.)^+`` is 1-Lipschitz, so adding or removing it changes
    ``lambda_i(x, v) = (v_i d_i U_m(x))^+`` by at most ``|xi_ni| <= B_i`` for every ``(x, v)``;
    replacing it, by at most ``2 B_i``.

    Parameters
    ----------
    bound : float or array_like
        ``B``: a bound on ``|feature|``, scalar or one per feature (:func:`feature_bound`).
    intercept : bool, optional
        Append the intercept coordinate (``xi = 1``, ``K = 1``) last, as the design of
        ``logistic-regression`` (:mod:`fedbayes_flwr.models.linear`) does.
    neighbours : {"add-remove", "replace"}
        The neighbouring relation of the guarantee.

    Returns
    -------
    numpy.ndarray
        ``(d,)`` sensitivities for :func:`privacy_of` and :func:`refresh_for_epsilon`.

    References
    ----------
    The seed paper, Theorem 5.1 (the condition ``|lambda(x, v) - lambda~(x, v)| <= K``) and its
    logistic regression example (Section 6); Bierkens, Fearnhead & Roberts (2019), Section 3.2.
    """
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours: {neighbours!r}; choose one of {', '.join(NEIGHBOURS)}")
    b = np.atleast_1d(np.asarray(bound, dtype=np.float64))
    if b.ndim != 1 or np.any(b < 0) or not np.all(np.isfinite(b)):
        raise ValueError(f"bound: finite, >= 0, scalar or one per feature, got {bound!r}")
    if intercept:
        b = np.concatenate([b, [1.0]])
    return b * (2.0 if neighbours == "replace" else 1.0)


def gaussian_mean_sensitivity(*args, **kwargs):
    r"""Always raises :class:`UnboundedSensitivityError`: for the Gaussian mean model a record
    ``y_n`` contributes ``(x_i - y_ni) / alpha^2`` to ``d_i U_m(x)``, which grows without bound
    with the chain's position ``x`` (Zig-Zag ranges over all of ``R^d``), so no ``K`` satisfies
    ``|lambda - lambda~| <= K`` everywhere, even for clipped data.

    References
    ----------
    The seed paper, Theorem 5.1 (the condition) and its Gaussian example.
    """
    raise UnboundedSensitivityError(
        "the Gaussian mean model has no finite rate sensitivity: one record y_n changes the "
        "Zig-Zag rate by |x_i - y_ni| / alpha^2, unbounded in the position x (even with clipped "
        "data), so Theorem 5.1's condition |lambda - lambda~| <= K fails and no refreshment rate "
        "makes its event times differentially private")
