r"""Differential privacy of Fed-PDMC's released event times through refreshment (Zig-Zag).

**What is released.** In every exchange each worker ``m`` sends the server, per chain, its proposed
event: the first arrival ``tau`` of its Zig-Zag clocks before the horizon ``H`` the server sent,
and the velocity that event would set (which coordinate ``i`` flips), or "none" (``tau = +inf``)
when no event falls before ``H``. With the privacy refreshment ``rho`` added to every coordinate
rate (``rate_shift`` of :func:`fedbayes_flwr.algorithms.pdmc.sampler.propose`) coordinate ``i`` fires at rate
``lambda_i(s) + rho`` along the line ``x + v s``, ``lambda_i(s) = (v_i d_i U_m(x + v s))^+``, and
the release ``(tau, i)`` has density and "none" probability

.. math::

    f(t, i) = (\lambda_i(t) + \rho)\, e^{-\sum_j \int_0^t (\lambda_j + \rho)}, \quad
    P(\mathrm{none}) = e^{-\sum_j \int_0^H (\lambda_j + \rho)}.

**Sensitivity.** Neighbouring data sets (worker ``m``'s rows with one record added or removed)
give rates ``lambda`` and ``lambda~`` with ``|lambda_i(x, v) - lambda~_i(x, v)| <= K_i`` for all
``(x, v)`` (the condition of the seed paper's Theorem 5.1). Then for ``t <= T``

.. math::

    \Bigl|\log \frac{f(t, i)}{\tilde f(t, i)}\Bigr|
    \le \log\Bigl(1 + \frac{K_i}{\rho}\Bigr) + t \sum_j K_j
    \le \log\Bigl(1 + \frac{K_{\max}}{\rho}\Bigr) + T \sum_j K_j

(the first term: ``(l + rho) / (l~ + rho) <= 1 + K / (l~ + rho) <= 1 + K / rho`` for rates
``l, l~ >= 0``; the second: the survival factors differ by at most ``exp(t sum_j K_j)``), and the
same bound holds for ``P(none)`` with ``t = H``.

**The guarantee** (:func:`privacy_of`). The survival term grows with the released time, and
``rho`` does not shrink it: refreshment alone cannot make an unbounded release ``epsilon``-DP.
Two ways to bound it:

* *pure* ``epsilon``-DP with a horizon ``H < inf`` (Fed-PDMC's ``max-horizon``: a worker never
  releases a time beyond it):
  ``epsilon = log(1 + K_max / rho) + H sum_j K_j``, so only ``epsilon > H sum_j K_j`` is
  reachable, with ``rho >= K_max / (exp(epsilon - H sum_j K_j) - 1)``;
* ``(epsilon, delta)``-DP with ``delta > 0``: every coordinate fires at rate at least ``rho``,
  so ``P(tau > T) <= exp(-d rho T) = delta`` for ``T = log(1 / delta) / (d rho)``; on
  ``tau <= T`` the bound above holds, hence
  ``epsilon = log(1 + K_max / rho) + min(H, log(1 / delta) / (d rho)) sum_j K_j``, which tends to
  0 as ``rho`` grows (any ``epsilon > 0`` is reachable). When ``H`` is the smaller window the
  release is in fact pure DP (``delta`` 0 is reported).

With one sensitivity ``K`` for all ``d`` coordinates and no horizon this reads
``epsilon = log(1 + K / rho) + (K / rho) log(1 / delta)``.

**Provenance.** The seed paper's Theorem 5.1 ("to achieve a certain level of differential
privacy, we may tune the refreshment rate of the algorithm to be at least ``rho`` as specified by
(7)", under ``|lambda(x, v) - lambda~(x, v)| <= K``) lost its statement and equation (7) in the
text this project has, and the full text could not be retrieved. The bounds here are DERIVED
from first principles as above, not quoted. They bound the privacy loss of the joint release
``(tau, i)`` (hence of ``tau`` alone) and are tight over the class ``|lambda - lambda~| <= K``:
``lambda = 0`` except on coordinate ``i`` just before ``H``, against ``lambda~ = K - lambda``,
attains them at ``tau -> H`` (for a particular model's rates they may be loose).

**Composition** (:func:`compose`, :func:`composed_epsilon`). Every reply of worker ``m`` for
every chain in every exchange, "none" included, is one release about worker ``m``'s rows; the
server's messages depend on earlier releases, so the releases compose adaptively. Basic
composition adds the ``epsilon`` and ``delta`` (Dwork & Roth 2014, Theorem 3.16); the advanced
composition (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Theorem 3.20) gives
``epsilon' = sqrt(2 k log(1 / delta')) epsilon + k epsilon (e^epsilon - 1)`` with ``delta``
``k delta + delta'`` for any slack ``delta' > 0``.

**Scope.** Zig-Zag only: a BPS bounce sets the velocity to the reflection of ``v`` in the plane
orthogonal to ``grad U_m(x)``, a deterministic function of the data (the released velocity
reveals the gradient's direction exactly), so no refreshment makes it private
(:func:`check_sampler`). The sensitivity must be bounded over all ``x``: logistic regression with
bounded features is (:func:`logistic_sensitivity`), the Gaussian mean is not
(:func:`gaussian_mean_sensitivity` raises). Only ``(tau, i)`` is covered: anything else a worker
sends that depends on its rows (the count of thinning candidates it evaluated, its wall time)
is a side channel outside the guarantee.

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Section 5, Theorem 5.1 and equation (7) (privacy through a refreshment
rate ``rho`` added to each worker's intensity, for ``|lambda - lambda~| <= K``) -- the bounds of
this module are derived, see "Provenance"; Dwork & Roth (2014), "The Algorithmic Foundations of
Differential Privacy", Definition 2.4 and Theorems 3.16, 3.20; Dwork, Rothblum & Vadhan (2010),
"Boosting and Differential Privacy"; Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process
and super-efficient sampling for Bayesian analysis of big data" (the rates).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

COMPOSITIONS = ("basic", "advanced")


class PrivacyGuarantee(NamedTuple):
    """An ``(epsilon, delta)``-DP guarantee (``delta`` 0: pure ``epsilon``-DP)."""

    epsilon: float
    delta: float


# ---------------------------------------------------------------------------- helpers
def _sensitivities(sensitivity, dim) -> tuple[float, float, int]:
    """``(K_max, sum_j K_j, d)`` from a scalar ``K`` (all ``dim`` coordinates) or one per
    coordinate."""
    k = np.asarray(sensitivity, dtype=np.float64)
    if k.ndim > 1:
        raise ValueError(f"sensitivity: a scalar or one value per coordinate, got shape {k.shape}")
    if not np.all(np.isfinite(k)) or np.any(k < 0):
        raise ValueError(f"sensitivity: must be finite and >= 0, got {sensitivity!r}")
    if k.ndim == 0:
        d = int(dim)
        if d < 1:
            raise ValueError(f"dim: must be >= 1, got {dim!r}")
        return float(k), float(k) * d, d
    if k.size == 0:
        raise ValueError("sensitivity: empty")
    if dim is not None and int(dim) != k.size:
        raise ValueError(f"dim: {dim} disagrees with the {k.size} per-coordinate sensitivities")
    return float(k.max()), float(k.sum()), int(k.size)


def _check_window(horizon, delta):
    if not (horizon > 0):
        raise ValueError(f"horizon: must be > 0, got {horizon!r}")
    if not (0 <= delta < 1):
        raise ValueError(f"delta: must be in [0, 1), got {delta!r}")
    if delta == 0 and math.isinf(horizon):
        raise ValueError("pure epsilon-DP needs a finite horizon: the privacy loss of a released "
                         "time t grows like t * sum_j K_j, which no refreshment rate bounds; give "
                         "horizon (the longest time a worker releases, max-horizon) or delta > 0")


def _window(rho: float, d: int, horizon: float, delta: float) -> tuple[float, float]:
    """``(T, delta_used)``: the time window on which the density ratio is bounded and the
    probability of a release beyond it (0 when the horizon is the window)."""
    if delta > 0 and rho > 0:
        t_delta = math.log(1.0 / delta) / (d * rho)
        if t_delta < horizon:
            return t_delta, delta
    return horizon, 0.0


# ---------------------------------------------------------------------------- the bound
def privacy_of(rho, sensitivity, *, dim: int | None = 1, horizon: float = math.inf,
               delta: float = 0.0) -> PrivacyGuarantee:
    r"""The DP guarantee of one released proposal (``(tau, i)`` or "none") of one worker.

    Parameters
    ----------
    rho : float
        The refreshment rate added to every Zig-Zag coordinate rate, ``>= 0``.
    sensitivity : float or array_like
        ``K`` (or ``K_i`` per coordinate) with ``|lambda_i - lambda~_i| <= K_i`` everywhere for
        neighbouring data sets.
    dim : int, optional
        ``d``, the number of coordinates, when ``sensitivity`` is a scalar (ignored, or checked,
        for a per-coordinate array; ``None`` to take it from the array).
    horizon : float, optional
        ``H``: no time beyond it is released (Fed-PDMC's ``max-horizon``). ``inf``: no cap.
    delta : float, optional
        ``0``: pure ``epsilon``-DP (needs a finite ``horizon``); ``> 0``: ``(epsilon, delta)``.

    Returns
    -------
    PrivacyGuarantee
        ``epsilon = log(1 + K_max / rho) + T sum_j K_j`` with ``T = min(H, log(1/delta)/(d rho))``
        (module docstring), ``inf`` when ``rho = 0`` and ``K > 0``; ``delta`` is the one used
        (0 when the horizon is the binding window).

    References
    ----------
    The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov
    Processes", Theorem 5.1 and equation (7): the setting (``|lambda - lambda~| <= K``,
    refreshment ``rho``); the formula is derived here, not quoted (module docstring).
    """
    kmax, ksum, d = _sensitivities(sensitivity, dim)
    rho, horizon, delta = float(rho), float(horizon), float(delta)
    if not (rho >= 0) or math.isinf(rho):
        raise ValueError(f"rho: must be finite and >= 0, got {rho!r}")
    _check_window(horizon, delta)
    if kmax == 0:
        return PrivacyGuarantee(0.0, 0.0)
    if rho == 0:
        return PrivacyGuarantee(math.inf, delta)
    window, used = _window(rho, d, horizon, delta)
    return PrivacyGuarantee(math.log1p(kmax / rho) + window * ksum, used)


def epsilon_of(rho, sensitivity, *, dim: int | None = 1, horizon: float = math.inf,
               delta: float = 0.0) -> float:
    """``epsilon`` of one released event time at refreshment ``rho`` (see :func:`privacy_of`,
    whose arguments it takes; the inverse of :func:`refresh_for_epsilon`).

    References
    ----------
    The seed paper, Theorem 5.1, equation (7) (setting); derived bound, module docstring.
    """
    return privacy_of(rho, sensitivity, dim=dim, horizon=horizon, delta=delta).epsilon


def refresh_for_epsilon(epsilon, sensitivity, *, dim: int | None = 1, horizon: float = math.inf,
                        delta: float = 0.0) -> float:
    r"""The smallest refreshment rate ``rho`` whose released event times are ``epsilon``-DP
    (``(epsilon, delta)``-DP with ``delta > 0``): the lower bound of the seed paper's
    Theorem 5.1 in this module's derived form.

    Parameters
    ----------
    epsilon : float
        The target privacy loss per released event time, ``> 0``.
    sensitivity, dim, horizon, delta
        As in :func:`privacy_of`.

    Returns
    -------
    float
        ``rho``; any larger rate is at least as private. ``delta = 0``:
        ``rho = K_max / (exp(epsilon - H sum_j K_j) - 1)``; ``delta > 0``: the root of
        :func:`epsilon_of` (strictly decreasing in ``rho``), by bisection. ``0.0`` when ``K = 0``.

    Raises
    ------
    ValueError
        ``delta = 0`` and ``epsilon <= H sum_j K_j``: the loss of a time near the horizon
        exceeds ``epsilon`` whatever ``rho`` (shorten the horizon or allow ``delta > 0``).

    References
    ----------
    The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov
    Processes", Theorem 5.1 and equation (7) (``rho`` at least a bound set by ``epsilon`` and
    ``K``); the bound is derived here, not quoted (module docstring).
    """
    kmax, ksum, d = _sensitivities(sensitivity, dim)
    epsilon, horizon, delta = float(epsilon), float(horizon), float(delta)
    if not (epsilon > 0) or math.isinf(epsilon):
        raise ValueError(f"epsilon: must be finite and > 0, got {epsilon!r}")
    _check_window(horizon, delta)
    if kmax == 0:
        return 0.0
    if delta == 0:
        room = epsilon - horizon * ksum
        if room <= 0:
            raise ValueError(
                f"epsilon = {epsilon:g} is out of reach with horizon {horizon:g}: a time released "
                f"near the horizon alone costs H * sum_j K_j = {horizon * ksum:g} whatever the "
                f"refreshment rate; shorten the horizon or allow delta > 0")
        return kmax / math.expm1(room)

    def loss(rho):
        return epsilon_of(rho, sensitivity, dim=d, horizon=horizon, delta=delta)

    # epsilon_of >= log(1 + K_max / rho)  =>  rho >= K_max / expm1(epsilon) = lo;
    # epsilon_of <= (K_max + sum_j K_j log(1/delta) / d) / rho  =>  hi suffices.
    lo = kmax / math.expm1(epsilon)
    hi = (kmax + ksum * math.log(1.0 / delta) / d) / epsilon
    hi = max(hi, lo)
    for _ in range(200):  # bisection on log(rho): machine precision well before 200 halvings
        mid = math.sqrt(lo * hi)
        if mid in (lo, hi):
            break
        if loss(mid) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


# ---------------------------------------------------------------------------- composition
def compose(per_event_epsilon, num_released, *, per_event_delta: float = 0.0,
            method: str = "basic", delta_slack: float = 0.0) -> PrivacyGuarantee:
    r"""The guarantee of ``k = num_released`` adaptively chosen releases, each
    ``(per_event_epsilon, per_event_delta)``-DP.

    Parameters
    ----------
    per_event_epsilon : float
    num_released : int
        Every reply of one worker (per chain, per exchange, "none" included).
    per_event_delta : float, optional
    method : {"basic", "advanced"}
        ``basic``: ``(k epsilon, k delta)`` (Dwork & Roth 2014, Theorem 3.16). ``advanced``:
        ``(sqrt(2 k log(1/delta')) epsilon + k epsilon (e^epsilon - 1), k delta + delta')``
        (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Theorem 3.20), which needs
        ``delta_slack = delta' > 0`` and wins for many releases of small ``epsilon``.
    delta_slack : float, optional
        ``delta'`` of the advanced composition.

    Returns
    -------
    PrivacyGuarantee
        ``delta`` is capped at 1.

    References
    ----------
    Dwork & Roth (2014), "The Algorithmic Foundations of Differential Privacy", Theorems 3.16
    and 3.20; Dwork, Rothblum & Vadhan (2010), "Boosting and Differential Privacy".
    """
    eps, delta, slack = float(per_event_epsilon), float(per_event_delta), float(delta_slack)
    k = int(num_released)
    if k != num_released or k < 0:
        raise ValueError(f"num_released: must be an integer >= 0, got {num_released!r}")
    if not (eps >= 0):
        raise ValueError(f"per_event_epsilon: must be >= 0, got {per_event_epsilon!r}")
    if not (0 <= delta <= 1):
        raise ValueError(f"per_event_delta: must be in [0, 1], got {per_event_delta!r}")
    if method not in COMPOSITIONS:
        raise ValueError(f"method: {method!r}; choose one of {', '.join(COMPOSITIONS)}")
    if k == 0:
        return PrivacyGuarantee(0.0, 0.0)
    if method == "basic":
        return PrivacyGuarantee(k * eps, min(1.0, k * delta))
    if not (0 < slack < 1):
        raise ValueError(f"delta_slack: the advanced composition needs 0 < delta' < 1, got "
                         f"{delta_slack!r}")
    total = math.sqrt(2.0 * k * math.log(1.0 / slack)) * eps + k * eps * math.expm1(eps)
    return PrivacyGuarantee(total, min(1.0, k * delta + slack))


def composed_epsilon(per_event_epsilon, num_released, *, per_event_delta: float = 0.0,
                     method: str = "basic", delta_slack: float = 0.0) -> float:
    """The ``epsilon`` of :func:`compose` (basic composition by default: the sum,
    ``num_released * per_event_epsilon``).

    References
    ----------
    Dwork & Roth (2014), Theorems 3.16 (basic) and 3.20 (advanced).
    """
    return compose(per_event_epsilon, num_released, per_event_delta=per_event_delta,
                   method=method, delta_slack=delta_slack).epsilon


# ---------------------------------------------------------------------------- scope checks
def check_sampler(sampler: str) -> None:
    """Raise ``ValueError`` unless ``sampler`` is ``zigzag`` (module docstring, "Scope": a BPS
    bounce releases the direction of ``grad U_m`` exactly).

    References
    ----------
    The seed paper, Theorem 5.1 (the rate shift ``lambda_m + rho``, Zig-Zag flips).
    """
    if sampler != "zigzag":
        raise ValueError(
            f"differential privacy of event times is available for the Zig-Zag sampler only, not "
            f"{sampler!r}: a BPS bounce reflects v in the plane orthogonal to grad U_m(x), so the "
            f"released velocity reveals the local gradient's direction exactly (infinite privacy "
            f"loss whatever the refreshment rate)")


