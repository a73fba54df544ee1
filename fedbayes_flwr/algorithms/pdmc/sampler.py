r"""Zig-Zag and bouncy particle samplers, federated: every worker proposes, the server takes the
earliest.

Notation: ``U = U_0 + sum_{m=1}^M U_m`` (``U_0`` the prior's, held by the server as worker 0),
``K`` independent chains, position ``x (K, d)``, velocity ``v (K, d)``, process time ``t (K,)``.
Between events ``x`` moves as ``x + v s``.

**Event rates** (Bierkens, Fearnhead & Roberts 2019; Bouchard-Cote, Vollmer & Doucet 2018):

* Zig-Zag, ``v`` in ``{-1, +1}^d``: worker ``m`` has one rate per coordinate,
  ``lambda_mi(x, v) = (v_i d_i U_m(x))^+``, and its event flips ``v_i``;
* BPS, ``v`` in ``R^d``: ``lambda_m(x, v) = (v . grad U_m(x))^+``; its event reflects ``v`` in the
  hyperplane orthogonal to ``g = grad U_m(x)``: ``v <- v - 2 (v . g) g / |g|^2``.

Both satisfy ``lambda_m(x, v) - lambda_m(x, -v) = v . grad U_m(x)`` with a kernel that reverses
the sign effectively, so the superposition ``lambda = sum_m lambda_m`` with "the earliest event
wins" leaves ``exp(-U(x)) dx nu(dv)`` invariant (Algorithm 2 of the seed paper: the server takes
the minimum proposed time and that worker's new velocity).

**One exchange** (:func:`propose` at each worker, :func:`server_proposal` and :func:`combine` at
the server). The server draws its own next event first (the prior's rate by exact inversion and,
for BPS, refreshment at total rate ``refresh``: ``v ~ N(0, I)``), and sends every worker ``x``, ``v``
and the horizon ``H = min(own time, max-horizon)``. Each worker simulates candidates from an
affine upper bound of its own rate along the line (``(a + b s)^+`` with ``a`` the rate's value
at the current point and ``b`` the bound on its slope, :mod:`.potentials`), inverts it exactly
(:func:`first_arrival`), and accepts a candidate at ``s`` with probability
``lambda_m(x + v s) / bound(s)`` (Poisson thinning; a rejected candidate restarts the bound from
there, the Poisson process being memoryless); quadratic potentials are exact, every candidate
accepted. A worker replies its first accepted time, or ``+inf`` when none falls before ``H``
(a rate that vanishes in the tails would otherwise be searched forever). The server takes the
earliest; if every time is ``+inf`` and its own event lies beyond ``max-horizon``, the chains move
by ``max-horizon`` with unchanged velocities (no event: the clocks are memoryless).

Each worker draws from its own stream, keyed on its partition: shared streams would make the
workers' proposals dependent and break the superposition.

References
----------
Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process and super-efficient sampling for
Bayesian analysis of big data", Sections 2-3 (rates, flips, thinning with affine bounds);
Bouchard-Cote, Vollmer & Doucet (2018), "The Bouncy Particle Sampler", Section 2 (reflection,
refreshment); the seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov
Processes", Algorithm 2 and Section 3 (the federated minimum); Lewis & Shedler (1979) (thinning).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SAMPLERS = ("zigzag", "bps")
MAX_CANDIDATES = 100_000


class Proposal(NamedTuple):
    """A worker's answer for ``K`` chains: event times (``inf``: none before the horizon), the new
    velocities, and the gradient evaluations spent (rejected candidates included)."""

    tau: np.ndarray
    velocity: np.ndarray
    grad_evals: int


def first_arrival(a, b, e) -> np.ndarray:
    """The first ``T`` with ``integral_0^T (a + b s)^+ ds = e`` (``+inf`` if never), elementwise.

    ``a > 0``: ``T = 2 e / (a + sqrt(a^2 + 2 b e))`` when ``a^2 + 2 b e >= 0`` (the stable root;
    with ``b < 0`` the rate dies at ``a / |b|`` having spent ``a^2 / (2 |b|)``, else ``+inf``);
    ``a <= 0``: the rate starts at ``-a / b`` (``b > 0``), then ``T = -a / b + sqrt(2 e / b)``;
    ``b <= 0`` never arrives.
    """
    a, b, e = np.broadcast_arrays(*(np.asarray(z, dtype=np.float64) for z in (a, b, e)))
    out = np.full(a.shape, np.inf)
    disc = a * a + 2.0 * b * e
    pos = (a > 0) & (disc >= 0)
    out[pos] = 2.0 * e[pos] / (a[pos] + np.sqrt(disc[pos]))
    rise = (a <= 0) & (b > 0)
    out[rise] = -a[rise] / b[rise] + np.sqrt(2.0 * e[rise] / b[rise])
    return out


def reflect(v: np.ndarray, g: np.ndarray) -> np.ndarray:
    """BPS bounce: ``v - 2 (v . g) g / |g|^2`` row by row (``g = 0``: ``v`` unchanged)."""
    norm2 = np.sum(g * g, axis=1, keepdims=True)
    coef = np.where(norm2 > 0, 2.0 * np.sum(v * g, axis=1, keepdims=True) / np.where(
        norm2 > 0, norm2, 1.0), 0.0)
    return v - coef * g


def _slopes(potential, sampler: str, v: np.ndarray) -> np.ndarray:
    """``b``: the slope bound of each rate along ``v`` (exact for quadratics)."""
    if sampler == "zigzag":
        if potential.quadratic:
            return v * (v @ potential.hessian.T)
        b = np.abs(v) @ potential.hess_abs.T
        if getattr(potential, "cauchy_schwarz", False):  # a preconditioned convex potential
            vbv = np.einsum("ki,ij,kj->k", v, potential.hess_bound, v)
            cs = np.sqrt(np.diag(potential.hess_bound))[None, :] * np.sqrt(np.maximum(vbv, 0.0))[:, None]
            b = np.minimum(b, cs)
        return b
    return np.einsum("ki,ij,kj->k", v, potential.hess_bound, v)


def propose(potential, sampler: str, x: np.ndarray, v: np.ndarray, horizon: np.ndarray,
            rng: np.random.Generator, rate_shift: float = 0.0) -> Proposal:
    """A worker's first event for each chain before ``horizon`` (module docstring).

    Parameters
    ----------
    potential : fedbayes_flwr.inference.potentials.Potential
        ``U_m``.
    sampler : {"zigzag", "bps"}
    x, v : numpy.ndarray
        ``(K, d)`` positions and velocities.
    horizon : numpy.ndarray
        ``(K,)`` times (relative to now) beyond which the answer is ``+inf``.
    rng : numpy.random.Generator
        This worker's stream.
    rate_shift : float
        A constant ``rho >= 0`` added to every Zig-Zag coordinate rate (the privacy
        refreshment of Theorem 5.1): ``(v_i d_i U_m)^+ + rho``; its events flip too.
    """
    k = x.shape[0]
    tau = np.full(k, np.inf)
    velocity = v.copy()
    elapsed = np.zeros(k)
    active = np.arange(k)
    evals = 0
    for _ in range(MAX_CANDIDATES):
        if active.size == 0:
            return Proposal(tau, velocity, evals)
        va = v[active]
        here = x[active] + va * elapsed[active, None]
        g = potential.grad(here)
        evals += active.size
        if sampler == "zigzag":
            # with a shift rho the rate is (v_i d_i U)^+ + rho <= (v_i d_i U(x))^+ + rho + b s
            a = va * g if rate_shift == 0 else np.maximum(va * g, 0.0) + rate_shift
            b = _slopes(potential, sampler, va)
            if rate_shift:
                b = np.maximum(b, 0.0)
            times = first_arrival(a, b, rng.exponential(size=a.shape))
            coord = np.argmin(times, axis=1)
            step = times[np.arange(active.size), coord]
        else:
            a = np.sum(va * g, axis=1)
            b = _slopes(potential, sampler, va)
            step = first_arrival(a, b, rng.exponential(size=active.size))
        u = rng.random(active.size)  # drawn for every candidate: streams do not depend on acceptance
        end = elapsed[active] + step
        beyond = ~(end < horizon[active])
        live = ~beyond
        if not np.any(live):
            return Proposal(tau, velocity, evals)
        rows, s = np.flatnonzero(live), step[live]
        at = here[rows] + va[rows] * s[:, None]
        g_end = potential.grad(at)
        evals += rows.size
        if sampler == "zigzag":
            c = coord[rows]
            idx = np.arange(rows.size)
            rate = np.maximum(0.0, va[rows, c] * g_end[idx, c]) + rate_shift
            bound = np.maximum(0.0, a[rows, c] + b[rows, c] * s)
        else:
            rate = np.maximum(0.0, np.sum(va[rows] * g_end, axis=1))
            bound = np.maximum(0.0, a[rows] + b[rows] * s)
        # quadratic potentials without a shift: the bound is the rate, up to rounding
        accept = (u[rows] * bound <= rate) | (potential.quadratic and rate_shift == 0)
        chains = active[rows]
        hit = chains[accept]
        tau[hit] = end[live][accept]
        if sampler == "zigzag":
            new = va[rows][accept].copy()
            new[np.arange(hit.size), coord[rows][accept]] *= -1.0
        else:
            new = reflect(va[rows][accept], g_end[accept])
        velocity[hit] = new
        elapsed[chains[~accept]] = end[live][~accept]
        keep = np.zeros(k, bool)
        keep[chains[~accept]] = True
        active = np.flatnonzero(keep)
    raise RuntimeError(f"no event decided after {MAX_CANDIDATES} candidates: the rate bound is "
                       f"far above the rate (check the potential's bounds)")


def server_proposal(prior, sampler: str, x, v, refresh: float, max_horizon: float,
                    rng: np.random.Generator) -> Proposal:
    """Worker 0: the prior's event (exact inversion) or a refreshment (BPS: ``v ~ N(0, I)`` at
    total rate ``refresh``; Zig-Zag: one uniformly chosen coordinate flipped, total rate
    ``refresh``), whichever is first, capped at ``max_horizon`` (``+inf`` beyond)."""
    k, d = x.shape
    cap = np.full(k, max_horizon)
    linear = getattr(prior, "linear", None)  # a re-centred split's tilt (potentials.tilt)
    moves = np.any(prior.hessian) or (linear is not None and np.any(linear))
    own = propose(prior, sampler, x, v, cap, rng) if moves else Proposal(
        np.full(k, np.inf), v.copy(), 0)
    tau, velocity = own.tau.copy(), own.velocity.copy()
    if refresh > 0:
        t_ref = rng.exponential(1.0 / refresh, size=k)
        if sampler == "bps":
            fresh = rng.standard_normal((k, d))
        else:
            fresh = v.copy()
            fresh[np.arange(k), rng.integers(0, d, size=k)] *= -1.0
        first = (t_ref < tau) & (t_ref < max_horizon)
        tau[first], velocity[first] = t_ref[first], fresh[first]
    return Proposal(tau, velocity, own.grad_evals)


def combine(own: Proposal, workers: list[Proposal], max_horizon: float):
    """The earliest proposal per chain: ``(tau, velocity, winner)`` with ``winner`` 0 for the
    server, ``m`` for worker ``m``, -1 for no event within ``max_horizon`` (then ``tau`` is
    ``max_horizon`` and the velocity unchanged). Ties go to the lower index."""
    taus = np.stack([own.tau] + [w.tau for w in workers])  # (M + 1, K)
    winner = np.argmin(taus, axis=0)
    k = taus.shape[1]
    tau = taus[winner, np.arange(k)]
    vels = np.stack([own.velocity] + [w.velocity for w in workers])
    velocity = vels[winner, np.arange(k)]
    none = ~np.isfinite(tau) | (tau > max_horizon)
    tau = np.where(none, max_horizon, tau)
    return tau, velocity, np.where(none, -1, winner)


def initial_velocity(sampler: str, rng: np.random.Generator, k: int, d: int) -> np.ndarray:
    """Zig-Zag: uniform on ``{-1, +1}^d``; BPS: ``N(0, I)``."""
    if sampler == "zigzag":
        return rng.choice(np.array([-1.0, 1.0]), size=(k, d))
    return rng.standard_normal((k, d))


def discretise(x0, v, t0, tau, next_time, delta):
    """Samples ``x(j delta)`` on one segment per chain: from ``(t0, x0)`` with velocity ``v`` for
    ``tau``; ``next_time (K,)`` is each chain's next grid time. Returns ``(rows, times, points,
    next_time)`` with ``rows`` the chain of each point."""
    t1 = t0 + tau
    counts = np.maximum(0, np.floor((t1 - next_time) / delta).astype(np.int64) + 1)
    counts = np.where(next_time <= t1, counts, 0)
    rows = np.repeat(np.arange(x0.shape[0]), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    times = next_time[rows] + offsets * delta
    points = x0[rows] + v[rows] * (times - t0[rows])[:, None]
    return rows, times, points, next_time + counts * delta


def segment_moments(x0, v, tau):
    """``(integral x ds, integral x^2 ds)`` over a linear segment of length ``tau`` per chain."""
    t = tau[:, None]
    first = x0 * t + 0.5 * v * t**2
    second = x0**2 * t + x0 * v * t**2 + v**2 * t**3 / 3.0
    return first, second
