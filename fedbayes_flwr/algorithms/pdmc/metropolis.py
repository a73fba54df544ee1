r"""Fed-PDMC without rate bounds: grid-interpolated rates and a Metropolis correction.

A worker whose ``U_m`` has no proven Hessian bound (a user's ``LikelihoodModel``, a BNN) cannot
thin. Instead it simulates from an **approximate** rate it can invert exactly, and the server
corrects the approximation by a Metropolis-Hastings step per trajectory, after Chevallier, Power
& Sutton (2025), whose scheme is: run the approximate PDMP for a fixed time ``T``, flip the
velocity, accept with the target ratio times the ratio of the reversed and forward path
densities. The derivation for the rates used here follows.

**The approximate rate.** Process time within a trajectory (the *clock* ``c``, reset to 0 at its
start) is cut into cells ``[j h, (j + 1) h)`` (``h`` = ``pdmc.rate-grid``; ``T`` a multiple of
``h``). While the chain moves along the line ``y(c) = x + v (c - c_x)``, worker ``m``'s *signed*
rate ``r(c) = v . grad U_m(y(c))`` (Zig-Zag: one per coordinate, ``v_i d_i U_m``) is evaluated at
the two cell ends ``y(j h)``, ``y((j + 1) h)`` of the line (extrapolated beyond the segment where
needed) and interpolated linearly; the rate is its positive part,
``lambda~_m(c) = (r~(c))^+``. On a cell that is ``(a + b s)^+``, inverted exactly by
:func:`fedbayes_flwr.algorithms.pdmc.sampler.first_arrival`: no bound, no thinning, one gradient per
cell (plus one at the left end of the first cell of every exchange). For a quadratic ``U_m`` the
signed rate is affine along lines, so ``lambda~_m = lambda_m`` exactly. The prior's rates and
BPS refreshment (the server's) stay exact. Events keep their kernels: Zig-Zag flips the
coordinate, BPS reflects in ``grad U_m`` at the event point (exact gradient).

**The path densities.** Given a start ``(x_0, v_0)``, a path with events at clocks
``c_1 < ... < c_n`` of labels ``(m_k, i_k)`` (worker, coordinate) has density
``prod_k lambda~_{m_k i_k}(c_k-) exp(-int_0^T sum_{m,i} lambda~_{mi} dc)`` (with respect to
Lebesgue measure on the event times, and counting measure on the labels). The reversed path,
started from ``(x_T, -v_T)``, passes the same points with velocity ``-v``; its clock
``T - c`` maps cells to cells (``T`` is a multiple of ``h``), so along every piece it sees the
same cell-end points with velocity ``-v``: its signed rate is ``-r~``, and its rate
``(-r~)^+``. Its event at ``c_k`` goes from ``-v_k+`` to ``-v_k-`` with the same label (a flip
or a reflection in the same gradient is its own inverse), at the rate interpolated along the
forward *post*-event line. Hence, with ``(r)^+ - (-r)^+ = r``,

``log q(reverse) - log q(forward) = sum_m int_0^T r~_m dc
+ sum_k [log lambda~^rev_{m_k i_k}(c_k) - log lambda~_{m_k i_k}(c_k-)]``,

where ``r~_m`` is the interpolated ``v . grad U_m`` (Zig-Zag: the sum of its coordinates' signed
rates is ``v . grad U_m`` too), and the MH log-ratio of the proposal ``(x_T, -v_T)`` is

``log alpha = sum_m [-(U_m(x_T) - U_m(x_0)) + int_0^T r~_m dc + sum_{k: m_k = m}
log(lambda~^rev(c_k) / lambda~(c_k-))]``.

The exact components (the prior, refreshment) contribute nothing: their event terms cancel
(``lambda(x, -R v) = lambda(x, v)`` for a flip or reflection ``R``), ``int v . grad U_0 =
U_0(x_T) - U_0(x_0)`` cancels the target's, and refreshment's ``N(0, I)`` densities telescope
against ``nu(v_T) / nu(v_0)`` (reflections keep ``|v|``). On acceptance the chain continues
from ``(x_T, v_T)`` (the proposal followed by the velocity flip, which keeps ``nu``); on
rejection from ``(x_0, -v_0)``. The chain of trajectory end points leaves
``exp(-U(x)) nu(dv)`` invariant for any ``h``; ``h`` trades the cost per cell against the
acceptance rate (exact, acceptance 1, for quadratics; the error of the trapezoid-like
interpolation is ``O(h^2)`` per cell for smooth ``U``). Only the end points are samples.

**The federated exchange.** Each worker computes its own term from the trajectory's pieces and
its own events (:func:`path_terms`): the server sends the skeleton once per trajectory (one
extra exchange) and adds the replies.

References
----------
Chevallier, Power & Sutton (2025), "Towards practical PDMP sampling: Metropolis adjustments,
locally adaptive step-sizes, and NUTS-based time lengths" (the scheme: approximate PDMP over a
fixed time, velocity flip, accept with the path-density ratio; the paper's text was not at hand,
so the grid rate and the ratio above are derived here, not quoted);
Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process and super-efficient sampling for
Bayesian analysis of big data", Section 2 (rates and flips); Bouchard-Cote, Vollmer & Doucet
(2018), "The Bouncy Particle Sampler", Section 2 (reflection, refreshment); Tierney (1998), "A
note on Metropolis-Hastings kernels for general state spaces" (MH with an involution).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.pdmc.sampler import Proposal, first_arrival, reflect

BOUNDS = ("exact", "metropolis", "auto")
MAX_CELLS = 100_000


def resolve(kind: str, has_bound: bool) -> str:
    """``auto`` -> ``exact`` when every worker's potential has rate bounds, else ``metropolis``."""
    if kind != "auto":
        return kind
    return "exact" if has_bound else "metropolis"


def has_bounds(potential) -> bool:
    """Whether a potential carries the Hessian bounds thinning needs."""
    return bool(getattr(potential, "quadratic", False)) or (
        getattr(potential, "hess_bound", None) is not None
        and getattr(potential, "hess_abs", None) is not None)


def _signed(sampler: str, v: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Zig-Zag: ``v_i d_i U`` per coordinate ``(K, d)``; BPS: ``v . grad U`` ``(K,)``."""
    return v * g if sampler == "zigzag" else np.sum(v * g, axis=-1)


def _cell(clock: np.ndarray, step: float) -> np.ndarray:
    return np.floor(clock / step + 1e-12)


def propose(potential, sampler: str, x: np.ndarray, v: np.ndarray, clock: np.ndarray,
            horizon: np.ndarray, step: float, rng: np.random.Generator) -> Proposal:
    """A worker's first event before ``horizon`` under the grid-interpolated rate (module
    docstring), for chains at trajectory clocks ``clock (K,)``; ``+inf`` for none."""
    k = x.shape[0]
    tau = np.full(k, np.inf)
    velocity = v.copy()
    left = _cell(clock, step) * step - clock  # the cell's left end, relative to now (<= 0)
    g_left = potential.grad(x + v * left[:, None])
    evals = k
    active = np.arange(k)
    for _ in range(MAX_CELLS):
        if active.size == 0:
            break
        va, sl = v[active], left[active]
        sr = sl + step
        g_right = potential.grad(x[active] + va * sr[:, None])
        evals += active.size
        rl, rr = _signed(sampler, va, g_left[active]), _signed(sampler, va, g_right)
        b = (rr - rl) / step
        start = np.maximum(sl, 0.0)
        if sampler == "zigzag":
            a = rl + b * (start - sl)[:, None]
            times = start[:, None] + first_arrival(a, b, rng.exponential(size=a.shape))
            coord = np.argmin(times, axis=1)
            when = times[np.arange(active.size), coord]
        else:
            a = rl + b * (start - sl)
            when = start + first_arrival(a, b, rng.exponential(size=active.size))
        limit = np.minimum(sr, horizon[active])
        hit = when < limit
        rows = active[hit]
        tau[rows] = when[hit]
        if sampler == "zigzag":
            new = va[hit].copy()
            new[np.arange(rows.size), coord[hit]] *= -1.0
        elif rows.size:
            g_at = potential.grad(x[rows] + va[hit] * when[hit, None])
            evals += rows.size
            new = reflect(va[hit], g_at)
        else:
            new = va[hit]
        velocity[rows] = new
        go_on = ~hit & (sr < horizon[active])
        g_left[active[go_on]] = g_right[go_on]
        left[active[go_on]] = sr[go_on]
        active = active[go_on]
    else:
        raise RuntimeError(f"no event decided after {MAX_CELLS} cells (pdmc.rate-grid too small "
                           f"for pdmc.max-horizon)")
    return Proposal(tau, velocity, evals)


class Path(NamedTuple):
    """One trajectory's skeleton for ``K`` chains (flat arrays). Pieces: chain, start clock,
    start point, velocity, length. Events: chain, clock, point, velocity before and after,
    winner (0 = the server, ``m`` = worker ``m``)."""

    piece_chain: np.ndarray
    piece_clock: np.ndarray
    piece_x: np.ndarray
    piece_v: np.ndarray
    piece_len: np.ndarray
    event_chain: np.ndarray
    event_clock: np.ndarray
    event_x: np.ndarray
    event_before: np.ndarray
    event_after: np.ndarray
    event_winner: np.ndarray


def empty_path(d: int) -> Path:
    i, f, m = np.zeros(0, np.int64), np.zeros(0), np.zeros((0, d))
    return Path(i, f, m, m, f, i, f, m, m, m, i)


def extend(path: Path, x, v, clock, tau, event, velocity, winner) -> Path:
    """``path`` with one exchange's pieces (every chain with ``tau > 0``) and events added."""
    moved = np.flatnonzero(tau > 0)
    hit = np.flatnonzero(event)
    end = x + v * tau[:, None]
    return Path(np.concatenate([path.piece_chain, moved]),
                np.concatenate([path.piece_clock, clock[moved]]),
                np.concatenate([path.piece_x, x[moved]]),
                np.concatenate([path.piece_v, v[moved]]),
                np.concatenate([path.piece_len, tau[moved]]),
                np.concatenate([path.event_chain, hit]),
                np.concatenate([path.event_clock, (clock + tau)[hit]]),
                np.concatenate([path.event_x, end[hit]]),
                np.concatenate([path.event_before, v[hit]]),
                np.concatenate([path.event_after, velocity[hit]]),
                np.concatenate([path.event_winner, winner[hit]]))


def _interp(potential, sampler, point, v, clock, step):
    """The interpolated signed rate at ``clock`` on the line through ``point`` (at ``clock``)
    with velocity ``v``, and its gradient cost."""
    j = _cell(clock, step)
    sl = j * step - clock
    gl = potential.grad(point + v * sl[:, None])
    gr = potential.grad(point + v * (sl + step)[:, None])
    rl, rr = _signed(sampler, v, gl), _signed(sampler, v, gr)
    w = (-sl / step)[:, None] if sampler == "zigzag" else -sl / step
    return rl + (rr - rl) * w, 2 * point.shape[0]


def end_terms(potential, x_start: np.ndarray, x_end: np.ndarray) -> np.ndarray:
    """``-(U_m(x_T) - U_m(x_0))`` per chain: the target's share of ``log alpha``."""
    return -(potential.value(x_end) - potential.value(x_start))


def piece(x, v, clock, tau, after, winner) -> Path:
    """One exchange's pieces and events as a :class:`Path` (``winner`` -1: no event)."""
    k, d = x.shape
    return extend(empty_path(d), x, v, clock, tau, winner >= 0, after, winner)


def path_terms(potential, sampler: str, path: Path, step: float, me: int,
               k: int) -> tuple[np.ndarray, int]:
    """Worker ``me``'s share of the path-density ratio per chain (module docstring):
    ``int r~_m dc + sum_{its events} log(lambda~^rev / lambda~)`` over ``path``, and the
    gradient evaluations spent (with :func:`end_terms`, its share of ``log alpha``)."""
    out = np.zeros(k)
    evals = 0
    # the integral of the interpolated v . grad U_m, cell by cell over every piece
    c0, ln = path.piece_clock, path.piece_len
    first = _cell(c0, step).astype(np.int64)
    last = np.maximum(np.ceil((c0 + ln) / step - 1e-12).astype(np.int64), first + 1)
    count = last - first
    rep = np.repeat(np.arange(c0.size), count)
    j = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count,
                                                                       count))
    if rep.size:
        cl, cr = j * step, (j + 1) * step
        p = np.maximum(c0[rep], cl)
        q = np.minimum(c0[rep] + ln[rep], cr)
        base, vel = path.piece_x[rep], path.piece_v[rep]
        gl = potential.grad(base + vel * (cl - c0[rep])[:, None])
        gr = potential.grad(base + vel * (cr - c0[rep])[:, None])
        evals += 2 * rep.size
        rl, rr = np.sum(vel * gl, axis=1), np.sum(vel * gr, axis=1)
        at_p = rl + (rr - rl) * (p - cl) / step
        at_q = rl + (rr - rl) * (q - cl) / step
        piece = np.maximum(q - p, 0.0) * 0.5 * (at_p + at_q)
        out = out + np.bincount(path.piece_chain[rep], weights=piece, minlength=k)
    mine = np.flatnonzero(path.event_winner == me)
    if mine.size:
        ex, c = path.event_x[mine], path.event_clock[mine]
        before, after = path.event_before[mine], path.event_after[mine]
        fwd, n1 = _interp(potential, sampler, ex, before, c, step)
        rev, n2 = _interp(potential, sampler, ex, after, c, step)
        evals += n1 + n2
        if sampler == "zigzag":
            i = np.argmax(before != after, axis=1)
            rows = np.arange(mine.size)
            fwd, rev = fwd[rows, i], rev[rows, i]  # rev: (-v+)_i ... = -(interp of v+_i d_i U)
        rev = -rev
        with np.errstate(divide="ignore"):
            term = np.log(np.maximum(rev, 0.0)) - np.log(np.maximum(fwd, 1e-300))
        out = out + np.bincount(path.event_chain[mine], weights=term, minlength=k)
    return out, evals
