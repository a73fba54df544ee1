"""The federated event loop without transport: for tests, benchmarks and in-process throughput.

:func:`simulate` runs ``K`` chains of Fed-PDMC (Zig-Zag or BPS) over ``M`` worker potentials and
the server's prior to a fixed process time, with the same exchange as the bundle
(:mod:`fedbayes_flwr.algorithms.pdmc.bundle`): the server's own proposal and horizon, every worker's
proposal from its own stream, the earliest event per chain. It returns the samples taken every
``delta`` units of process time and the work counters.

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Algorithm 2.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.pdmc import sampler as S


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


def simulate(workers: list, prior, sampler: str, x0: np.ndarray, v0: np.ndarray,
             process_time: float, delta: float, seed: int = 0, refresh: float = 0.0,
             max_horizon: float = 1.0, burn_in: float = 0.0) -> Run:
    """Run every chain to ``process_time``; samples at ``j delta >= burn_in`` (module docstring).

    Worker ``m`` (1-based; the server is 0) draws from ``default_rng([seed, exchange, m])``.
    """
    x, v = np.array(x0, dtype=np.float64), np.array(v0, dtype=np.float64)
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
    per = [points[rows == j] for j in range(k)]
    n = min(len(p) for p in per)
    return Run(np.stack([p[:n] for p in per]), x, v, events, grad_evals, exchanges, winners)
