r"""Fed-PDMC's agreed linear preconditioner ``x = m + L z`` from a federated Laplace fit.

Zig-Zag moves along the coordinate axes and BPS bounces off the gradient: on a correlated or
badly scaled posterior both need many events per effective sample. Sampling ``z`` with
``U^z(z) = U(m + L z)`` instead (:class:`fedbayes_flwr.inference.potentials.Preconditioned`, whose
rate bounds stay valid in ``z``) with ``L L^T`` close to the posterior covariance makes the
target close to ``N(0, I)`` and the process isotropic. Any fixed invertible ``L`` leaves the
sampler exact (the Jacobian is constant); only its efficiency depends on ``L``.

**The fit** (``pdmc.preconditioner`` ``diagonal`` or ``dense``; ``auto``: ``dense`` unless
``d > AUTO_DENSE_MAX`` (then ``diagonal``: ``d^2`` floats in every message) or differential
privacy is on (then ``none``: the privacy analysis covers the event times, not the gradients
and Hessians the fit releases)). Before any event, the server runs damped Newton on
``U = U_0 + sum_m U_m`` from the prior's mean: every exchange it sends the trial point ``x``;
each worker replies ``U_m(x)``, ``grad U_m(x)`` and its Hessian ``H_m(x)`` (``d + d^2`` floats);
the server adds its prior's. A trial that raises ``U`` is halved back towards the current
point (backtracking over exchanges); otherwise it becomes the current point and the next trial
is ``x - H^{-1} g`` (``H`` with its eigenvalues floored at ``EIG_FLOOR`` times the largest, so a
non-convex ``U`` still gives a descent direction). It stops when the Newton decrement
``g^T H^{-1} g / 2`` falls below ``NEWTON_TOL`` (in nats: the point is within that of the
local quadratic model's minimum) or after ``pdmc.laplace-steps`` exchanges. Then ``m`` = the
point and, with ``H`` at it:

* ``dense``: ``L = R^{-T}`` for the Cholesky factor ``H = R R^T`` (``L L^T = H^{-1}``, the
  Laplace covariance);
* ``diagonal``: ``L = diag(sqrt(diag(H^{-1})))``, the Laplace marginal standard deviations.

The server then sends ``m`` and ``L`` with every event exchange, and every worker's rates and
bounds are its ``U_m``'s in ``z``. The split is re-centred at ``m`` too
(:func:`split_at_mode`): each worker samples with ``U_m(x) - grad U_m(m) . x`` (it computes
``grad U_m(m)`` itself from ``m``) and the server's prior carries ``+ sum_m grad U_m(m) . x``
(known from the fit's last exchange), so ``U`` and every Hessian bound are unchanged while the
workers' rates no longer disagree at the mode (label-skewed workers otherwise add many events
that only reverse the chains). The fit's exchanges count as exchanges (the run's updates)
and its Hessians as gradient evaluations (a Hessian = ``d`` gradients for logistic regression,
``d (d + 3) / 2`` Hessian-vector rows otherwise).

**Why a Laplace fit and not the adaptive burn-in of Bertazzi & Bierkens (2022).** Their
schemes estimate the covariance from the chains' own history; on the problem this is for, the
unpreconditioned chains mix slowly (that is the problem), so the early covariance estimate is
poor and has to be refined over several windows, each spending events in bad coordinates, and
the chains' transient from over-dispersed starts inflates it. A posterior with ``n`` in the
thousands is close to its Laplace approximation, whose Hessian a handful of Newton exchanges
give exactly (each ``d^2`` floats per worker, a small fraction of the events' traffic); every
event of the run is then spent in good coordinates and the sampling phase is a fixed PDMP from
the first event. Where the Laplace fit is poor (a heavy-tailed or multimodal posterior) the
sampler is still exact, only slower.

References
----------
Bertazzi & Bierkens (2022), "Adaptive schemes for piecewise deterministic Monte Carlo
algorithms", Section 2 (PDMPs after a linear change of variables) and Section 3 (the adaptive
alternative); Nocedal & Wright (2006), "Numerical Optimization", Section 3.4 (Newton with a
modified Hessian) and Algorithm 3.1 (backtracking); Tierney & Kadane (1986), "Accurate
approximations for posterior moments and marginal densities" (the Laplace approximation).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.inference.potentials import recentre, tilt

KINDS = ("none", "diagonal", "dense", "auto")
AUTO_DENSE_MAX = 100
EIG_FLOOR = 1e-10
NEWTON_TOL = 1e-8


class Laplace(NamedTuple):
    """The server's Newton state: the current point, ``U``, ``grad U`` and Hessian there (all
    zero, unused, before the first reply: ``steps`` 0), the next trial point, and the exchanges
    spent."""

    point: np.ndarray
    value: float
    grad: np.ndarray
    hess: np.ndarray
    trial: np.ndarray
    steps: int


def resolve(kind: str, dim: int, private: bool, bound_free: bool = False) -> str:
    """``auto`` -> ``dense`` (``dim <= AUTO_DENSE_MAX``) or ``diagonal``; ``none`` with DP, and
    ``none`` above ``AUTO_DENSE_MAX`` for a model without rate bounds (``bound_free``: its
    Hessians come from ``d (d + 3) / 2`` Hessian-vector rows per fit exchange, e.g. a BNN)."""
    if kind != "auto":
        return kind
    if private or (bound_free and dim > AUTO_DENSE_MAX):
        return "none"
    return "dense" if dim <= AUTO_DENSE_MAX else "diagonal"


def start(point: np.ndarray) -> Laplace:
    d = point.shape[0]
    return Laplace(point.copy(), 0.0, np.zeros(d), np.zeros((d, d)), point.copy(), 0)


def _floored(h: np.ndarray) -> np.ndarray:
    """``h`` symmetrised with its eigenvalues' magnitudes floored at ``EIG_FLOOR`` x the largest
    (positive definite; ``h`` itself when it already is, up to rounding)."""
    h = 0.5 * (h + h.T)
    w, q = np.linalg.eigh(h)
    top = max(float(np.max(np.abs(w))), 1e-300)
    w = np.maximum(np.abs(w), EIG_FLOOR * top)
    return (q * w) @ q.T


def newton_update(state: Laplace, value: float, grad: np.ndarray, hess: np.ndarray,
                  max_steps: int) -> tuple[Laplace, bool]:
    """One exchange of damped Newton (module docstring): the totals at ``state.trial`` in, the
    next state and whether the fit is finished out."""
    steps = state.steps + 1
    if state.steps == 0 or value <= state.value + 1e-12 * abs(state.value):
        h = _floored(hess)
        step = np.linalg.solve(h, grad)
        decrement = 0.5 * float(grad @ step)
        new = Laplace(state.trial.copy(), float(value), grad, hess, state.trial - step, steps)
        return new, bool(decrement < NEWTON_TOL or steps >= max_steps)
    half = 0.5 * (state.point + state.trial)
    return state._replace(trial=half, steps=steps), steps >= max_steps


def transform(kind: str, hess: np.ndarray) -> np.ndarray:
    """``L`` from the total Hessian at the mode: dense ``R^{-T}`` (``H = R R^T``), or diagonal
    ``sqrt(diag(H^{-1}))`` as a ``(d,)`` vector (module docstring)."""
    h = _floored(hess)
    r = np.linalg.cholesky(h)
    inv_rt = np.linalg.solve(r.T, np.eye(h.shape[0]))  # R^{-T}: (R^{-T})(R^{-T})^T = H^{-1}
    if kind == "dense":
        return inv_rt
    if kind == "diagonal":
        return np.sqrt(np.sum(inv_rt * inv_rt, axis=1))
    raise ValueError(f"no transform for preconditioner {kind!r}")


def split_at_mode(workers: list, prior, point: np.ndarray, total_grad: np.ndarray):
    """The re-centred split at ``point`` (:func:`fedbayes_flwr.inference.potentials.recentre`):
    each worker's ``U_m - grad U_m(point) . x`` and the prior tilted by
    ``sum_m grad U_m(point) = total_grad - grad U_0(point)`` (the server knows ``total_grad`` from
    the fit's last exchange; each worker computes its own offset from ``point``)."""
    offsets = total_grad - prior.grad(np.asarray(point)[None])[0]
    return [recentre(w, point) for w in workers], tilt(prior, offsets)


def laplace_fit(potentials: list, point: np.ndarray, kind: str, max_steps: int = 30):
    """The same fit without transport (driver, tests): ``(m, L, state)`` for ``U = sum`` of
    ``potentials`` (the prior among them; ``state.grad`` is the total gradient at ``m``)."""
    state = start(np.asarray(point, dtype=np.float64))
    while True:
        x = state.trial[None]
        value = float(sum(float(p.value(x)[0]) for p in potentials))
        grad = sum(p.grad(x)[0] for p in potentials)
        hess = sum(p.hessian_at(state.trial)[0] for p in potentials)
        state, done = newton_update(state, value, grad, hess, max_steps)
        if done:
            return state.point, transform(kind, state.hess), state
