"""Decentralized MH-HMC without transport: all agents and chains vectorised (tests, benchmarks).

:func:`simulate` runs the iteration of :mod:`fedbayes_flwr.algorithms.dhmc.agents` for ``m`` agents and ``K``
chains with the mixing matrix applied as ``W^s`` over the agent axis, the shared draws from
``default_rng([seed, iteration])``, dual averaging of the shared step size during the warm-up
(Metropolis test on unless ``warmup_metropolis=False``), and returns every agent's iterates after the warm-up.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.decentralized.mixing import parse_schedule, scheduled_rounds
from fedbayes_flwr.algorithms.dhmc import agents as dhmc


class Run(NamedTuple):
    """``samples (m, K, T, d)`` per agent after the warm-up; acceptance rate; how often agents
    disagreed on a decision; consensus error per kept iteration (relative to ``posterior_var``
    if given, else absolute); the step size; gradient evaluations per agent."""

    samples: np.ndarray
    accept_rate: float
    disagreement: float
    consensus: np.ndarray
    epsilon: float
    grad_evals: int


def _stack(states: list) -> dhmc.AgentState:
    return dhmc.AgentState(*(np.stack(parts) for parts in zip(*states, strict=True)))


def _unstack(state: dhmc.AgentState, m: int) -> list:
    return [dhmc.AgentState(*(a[i] for a in state)) for i in range(m)]


def simulate(potentials: list, mixing: np.ndarray, w0: np.ndarray, epsilon: float,
             iterations: int, warmup: int = 0, rounds: int | str = 1, seed: int = 0,
             integrator: str = "leapfrog", energy: str = "taylor", adapt: bool = True,
             target_accept: float = 0.6, posterior_var=None, decision: str = "local",
             warmup_metropolis: bool = True, leapfrog_steps: int = 1) -> Run:
    """Run ``warmup + iterations`` iterations from ``w0 (K, d)`` (module docstring); ``rounds``
    is a number of mixing rounds per phase or a schedule
    (:func:`fedbayes_flwr.algorithms.decentralized.mixing.parse_schedule`); ``leapfrog_steps``
    ``L > 1`` repeats the mixing and tracking at every position, as the bundle does (exact
    energy)."""
    if leapfrog_steps > 1 and (integrator != "leapfrog" or energy != "exact"):
        raise ValueError(f"{leapfrog_steps} leapfrog steps need integrator 'leapfrog' and "
                         f"energy 'exact' (got {integrator!r}, {energy!r})")
    m = len(potentials)
    k, d = w0.shape
    schedule = parse_schedule(rounds) if isinstance(rounds, str) else ((-1, int(rounds)),)
    powers = {r: np.linalg.matrix_power(np.asarray(mixing, dtype=np.float64), r)
              for _, r in schedule}
    states = [dhmc.init_agent(pot, w0) for pot in potentials]
    da = dhmc.dual_averaging_init(epsilon)
    eps = epsilon
    kept, consensus, accepts, disagree = [], [], [], []
    evals = 1
    for it in range(warmup + iterations):
        mix = powers[scheduled_rounds(schedule, it)]
        rng = np.random.default_rng([seed, it])
        p, log_u = dhmc.shared_draws(rng, k, d)
        warm = it < warmup
        begun = [dhmc.begin(st, pot, p, eps, m, integrator, energy)
                 for st, pot in zip(states, potentials, strict=True)]
        z = np.tensordot(mix, np.stack([b[1] for b in begun]), axes=1)
        if leapfrog_steps > 1:  # the energy enters with the trajectory's last position
            a = np.tensordot(mix, np.stack([b[0].aleph for b in begun]), axes=1)
        else:
            a = np.tensordot(mix, np.stack([b[2] for b in begun]), axes=1)
        y_kept = np.stack([b[0].y for b in begun])
        cur = [b[0] for b in begun]
        y_prev = g_prev = None
        for leap in range(1, leapfrog_steps + 1):
            tracked = [dhmc.track(st, pot, z[i], None if y_prev is None else y_prev[i],
                                  None if g_prev is None else g_prev[i])
                       for i, (st, pot) in enumerate(zip(cur, potentials, strict=True))]
            cur = [t[0] for t in tracked]
            y = np.tensordot(mix, np.stack([t[1] for t in tracked]), axes=1)
            y_kept = np.tensordot(mix, y_kept, axes=1)
            if leap < leapfrog_steps:  # the next position (agents.advance)
                last = leap + 1 == leapfrog_steps
                moved = [dhmc.advance(st, pot, z[i], y[i], eps, m, last)
                         for i, (st, pot) in enumerate(zip(cur, potentials, strict=True))]
                cur = [q[0] for q in moved]
                if last:
                    a = np.tensordot(mix, a + np.stack([st.c - st.c_last for st in cur]),
                                     axes=1)
                else:
                    a = np.tensordot(mix, a, axes=1)
                z = np.tensordot(mix, np.stack([q[1] for q in moved]), axes=1)
                y_prev, g_prev = y, np.stack([st.grad_z for st in cur])
                evals += 1
        tracked = [(st, None) for st in cur]
        outs = [dhmc.decide(t[0], a[i], y[i], log_u, eps, m, integrator,
                            metropolis=warmup_metropolis or not warm)
                for i, t in enumerate(tracked)]
        decided = np.stack([o.accepted for o in outs])  # (m, K)
        final = decided if decision == "local" else np.broadcast_to(decided.all(axis=0),
                                                                    decided.shape)
        states = [dhmc.apply(t[0], z[i], a[i], y[i], y_kept[i], final[i])
                  for i, t in enumerate(tracked)]
        evals += 1 + (energy == "exact")
        probs = np.stack([o.accept_prob for o in outs])  # (m, K)
        # agreed decisions accept only what every agent accepts: adapt on the minimum (as the
        # bundle does)
        prob = float(np.mean(probs if decision == "local" else probs.min(axis=0)))
        if warm:
            if adapt:
                da = dhmc.dual_averaging_step(da, prob, target_accept)
                eps = float(np.exp(da.log_eps)) if it < warmup - 1 else float(
                    np.exp(da.log_eps_bar))
            continue
        accepts.append(final.mean())
        disagree.append(np.mean(decided.any(axis=0) & ~decided.all(axis=0)))
        w = np.stack([st.w for st in states])  # (m, K, d)
        kept.append(w)
        consensus.append(dhmc.consensus_error(w, posterior_var))
    samples = np.stack(kept, axis=2) if kept else np.zeros((m, k, 0, d))
    return Run(samples, float(np.mean(accepts)) if accepts else float("nan"),
               float(np.mean(disagree)) if disagree else 0.0, np.asarray(consensus), eps, evals)
