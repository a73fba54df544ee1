"""The federated event loop without transport: for tests, benchmarks and in-process throughput.

:func:`simulate` runs ``K`` chains of Fed-PDMC (Zig-Zag or BPS) over ``M`` worker potentials and
the server's prior to a fixed process time, with the same exchange as the bundle
(:mod:`fedbayes_flwr.algorithms.pdmc.bundle`): the server's own proposal and horizon, every worker's
proposal from its own stream, the earliest event per chain. It returns the samples taken every
``delta`` units of process time and the work counters. With ``preconditioner`` (``diagonal``,
``dense``, ``auto`` = dense) the chains run in ``z`` of ``x = m + L z`` from the Laplace fit
(:func:`fedbayes_flwr.algorithms.pdmc.precondition.laplace_fit`, from the mean of ``x0``; the
split re-centred at ``m``: :func:`~fedbayes_flwr.algorithms.pdmc.precondition.split_at_mode`): the
starts ``x0`` are mapped to ``z`` (an exact draw of ``x`` stays one), the velocities ``v0`` are
taken as ``z``-velocities (their law is the same), and the samples and final ``x`` are returned
in the model's coordinates (``v`` stays in ``z``).

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Algorithm 2.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.pdmc import metropolis as MH
from fedbayes_flwr.algorithms.pdmc import precondition as PC
from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.inference.potentials import precondition, to_model


class Run(NamedTuple):
    """``chains (K, S, d)`` samples after ``burn_in``; final ``x``, ``v``; events per chain;
    gradient evaluations; exchanges; events won by each worker (0 = the server)."""

    chains: np.ndarray
    x: np.ndarray
    v: np.ndarray
    events: np.ndarray
    grad_evals: int
    exchanges: int
    winners: np.ndarray
    acceptance: float = 1.0


def simulate(workers: list, prior, sampler: str, x0: np.ndarray, v0: np.ndarray,
             process_time: float, delta: float, seed: int = 0, refresh: float = 0.0,
             max_horizon: float = 1.0, burn_in: float = 0.0, preconditioner: str = "none",
             bounds: str = "exact", trajectory: float = 1.0, rate_grid: float = 0.5) -> Run:
    """Run every chain to ``process_time``; samples at ``j delta >= burn_in`` (module docstring).

    Worker ``m`` (1-based; the server is 0) draws from ``default_rng([seed, exchange, m])``.
    With ``bounds`` ``metropolis`` (``auto``: when a worker has no rate bounds) the workers use
    grid-interpolated rates (:mod:`.metropolis`, grid step ``rate_grid``) and every
    ``trajectory`` units of process time (rounded up to a multiple of ``rate_grid``) end in a
    Metropolis step; the samples are then the chains' states after each step with
    ``j trajectory >= burn_in`` (``delta`` is unused).
    """
    x, v = np.array(x0, dtype=np.float64), np.array(v0, dtype=np.float64)
    kind = PC.resolve(preconditioner, x.shape[1], private=False)
    shift, scale = np.zeros(0), np.zeros(0)
    if kind != "none":
        shift, scale, fit = PC.laplace_fit([prior, *workers], x.mean(0), kind)
        workers, prior = PC.split_at_mode(workers, prior, shift, fit.grad)
        workers = [precondition(w, shift, scale) for w in workers]
        prior = precondition(prior, shift, scale)
        x = (x - shift) / scale if scale.ndim == 1 else np.linalg.solve(scale, (x - shift).T).T
    kind_b = MH.resolve(bounds, all(MH.has_bounds(w) for w in workers))
    if kind_b == "metropolis":
        return _metropolis(workers, prior, sampler, x, v, process_time, seed, refresh,
                           max_horizon, burn_in, trajectory, rate_grid, shift, scale, kind)
    k, d = x.shape
    t = np.zeros(k)
    next_sample = np.full(k, float(np.ceil(burn_in / delta) * delta))
    events = np.zeros(k, np.int64)
    winners = np.zeros(len(workers) + 1, np.int64)
    rows_all, points_all = [], []
    grad_evals = exchanges = 0
    while np.any(t < process_time):
        exchanges += 1
        own = S.server_proposal(prior, sampler, x, v, refresh, max_horizon,
                                np.random.default_rng([seed, exchanges, 0]))
        horizon = np.minimum(own.tau, max_horizon)
        props = [S.propose(w, sampler, x, v, horizon, np.random.default_rng([seed, exchanges, m]))
                 for m, w in enumerate(workers, start=1)]
        grad_evals += own.grad_evals + sum(p.grad_evals for p in props)
        tau, velocity, winner = S.combine(own, props, max_horizon)
        tau = np.minimum(tau, np.maximum(process_time - t, 0.0))
        rows, _, points, next_sample = S.discretise(x, v, t, tau, next_sample, delta)
        rows_all.append(rows)
        points_all.append(points)
        event = (winner >= 0) & (tau > 0) & (t + tau < process_time)
        x = x + v * tau[:, None]
        v = np.where(event[:, None], velocity, v)
        t = t + tau
        events += event
        winners += np.bincount(winner[event], minlength=winners.size)
    rows, points = np.concatenate(rows_all), np.concatenate(points_all)
    if kind != "none":
        points, x = to_model(points, shift, scale), to_model(x, shift, scale)
    per = [points[rows == j] for j in range(k)]
    n = min(len(p) for p in per)
    return Run(np.stack([p[:n] for p in per]), x, v, events, grad_evals, exchanges, winners)


def _metropolis(workers, prior, sampler, x, v, process_time, seed, refresh, max_horizon,
                burn_in, trajectory, rate_grid, shift, scale, kind) -> Run:
    """:func:`simulate` with ``bounds`` ``metropolis``: trajectories of the approximate process,
    each followed by the Metropolis step of :mod:`.metropolis` (one more exchange)."""
    k, d = x.shape
    length = float(np.ceil(trajectory / rate_grid - 1e-9) * rate_grid)
    count = int(np.ceil(process_time / length - 1e-9))
    events = np.zeros(k, np.int64)
    winners = np.zeros(len(workers) + 1, np.int64)
    samples, accepted = [], 0
    grad_evals = exchanges = 0
    for n in range(count):
        clock = np.zeros(k)
        x0, v0 = x.copy(), v.copy()
        path = MH.empty_path(d)
        while np.any(clock < length):
            exchanges += 1
            own = S.server_proposal(prior, sampler, x, v, refresh, max_horizon,
                                    np.random.default_rng([seed, exchanges, 0]))
            left = np.maximum(length - clock, 0.0)
            horizon = np.minimum(np.minimum(own.tau, max_horizon), left)
            props = [MH.propose(w, sampler, x, v, clock, horizon, rate_grid,
                                np.random.default_rng([seed, exchanges, m]))
                     for m, w in enumerate(workers, start=1)]
            grad_evals += own.grad_evals + sum(p.grad_evals for p in props)
            tau, velocity, winner = S.combine(own, props, max_horizon)
            tau = np.minimum(tau, left)
            event = (winner >= 0) & (tau > 0) & (clock + tau < length)
            path = MH.extend(path, x, v, clock, tau, event, velocity, winner)
            x = x + v * tau[:, None]
            v = np.where(event[:, None], velocity, v)
            clock = clock + tau
            events += event
            winners += np.bincount(winner[event], minlength=winners.size)
        exchanges += 1  # the Metropolis exchange: every worker's share of log alpha
        log_alpha = np.zeros(k)
        for m, w in enumerate(workers, start=1):
            term, cost = MH.path_terms(w, sampler, path, rate_grid, m, k)
            log_alpha += term + MH.end_terms(w, x0, x)
            grad_evals += cost + 2 * k
        u = np.random.default_rng([seed, exchanges, 0]).random(k)
        accept = np.log(u) < log_alpha
        accepted += int(accept.sum())
        x = np.where(accept[:, None], x, x0)
        v = np.where(accept[:, None], v, -v0)
        if (n + 1) * length >= burn_in:
            samples.append(x.copy())
    chains = np.stack(samples, axis=1) if samples else x[:, None, :]
    if kind != "none":
        chains, x = to_model(chains, shift, scale), to_model(x, shift, scale)
    return Run(chains, x, v, events, grad_evals, exchanges, winners,
               accepted / max(1, count * k))
