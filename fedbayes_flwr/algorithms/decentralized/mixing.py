"""Gossip mixing over a communication graph: matrices, their spectral gap, and schedules.

One gossip round replaces every agent's value by a weighted average of its own and its
neighbours' values, ``x <- W x``, with a symmetric, doubly stochastic, one-hop mixing matrix
``W`` (``W_ij = 0`` unless ``i = j`` or ``i ~ j``) over a
:class:`fedbayes_flwr.algorithms.decentralized.graphs.Graph`.

* :func:`metropolis_weights` (the Metropolis-Hastings mixing matrix), :func:`spectral_gap`
  (``1 - `` the second-largest eigenvalue modulus), :func:`rounds_for` (rounds for a consensus
  tolerance) and :func:`mix` (``W^rounds`` applied to the stacked agent values).
* :func:`parse_schedule` / :func:`scheduled_rounds`: mixing rounds per phase by iteration.

References
----------
Xiao & Boyd (2004), "Fast linear iterations for distributed averaging", Systems & Control Letters
53(1), 65-78: the Metropolis-Hastings weights ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges,
``W_ii = 1 - sum_j W_ij``, and convergence of ``W^k x`` to the average at the rate of the
second-largest eigenvalue modulus of a symmetric ``W``.
"""

from __future__ import annotations

import math

import numpy as np

from fedbayes_flwr.algorithms.decentralized.graphs import Graph, as_adjacency, check_count

__all__ = ["metropolis_weights", "mix", "parse_schedule", "rounds_for", "scheduled_rounds",
           "spectral_gap"]

#: Absolute tolerance for the symmetry and stochasticity checks of a mixing matrix.
MIXING_ATOL = 1e-9


def parse_schedule(text: str) -> tuple[tuple[int, int], ...]:
    """A mixing-round schedule ``"R1:T1,R2:T2,...,RL"``: ``R1`` rounds per phase for iterations
    ``t <= T1``, ``R2`` for ``T1 < t <= T2``, ..., ``RL`` afterwards (the last value caps it).
    Returns ``((T1, R1), ..., (inf, RL))`` as ints (``-1`` standing for infinity). The reference
    code's milestones 2000, 3000, 4000 with 1, 2, 3 rounds are ``"1:2000,2:3000,3"``.

    Raises
    ------
    ValueError
        For a malformed entry, rounds below 1, milestones not increasing, or a last entry with a
        milestone.
    """
    entries = [e.strip() for e in str(text).split(",") if e.strip()]
    if not entries:
        raise ValueError("empty mixing schedule")
    out, last = [], -1
    for i, entry in enumerate(entries):
        rounds, sep, until = entry.partition(":")
        final = i == len(entries) - 1
        if final and sep:
            raise ValueError(f"the last entry {entry!r} must be rounds only (it holds from its "
                             f"milestone on), e.g. \"1:2000,5:3000,10\"")
        if not final and not sep:
            raise ValueError(f"entry {entry!r} needs a milestone, ROUNDS:ITERATION")
        try:
            r, t = int(rounds), (int(until) if sep else -1)
        except ValueError:
            raise ValueError(f"entry {entry!r} is not ROUNDS:ITERATION with integers") from None
        if r < 1:
            raise ValueError(f"entry {entry!r}: rounds must be >= 1")
        if sep and t <= last:
            raise ValueError(f"entry {entry!r}: milestones must increase")
        last = t if sep else last
        out.append((t, r))
    return tuple(out)


def scheduled_rounds(schedule: tuple[tuple[int, int], ...], iteration: int) -> int:
    """The rounds per phase at ``iteration`` under a :func:`parse_schedule` schedule."""
    for until, rounds in schedule:
        if until < 0 or iteration <= until:
            return rounds
    return schedule[-1][1]


def metropolis_weights(graph: Graph | np.ndarray) -> np.ndarray:
    """Metropolis-Hastings mixing matrix of a connected graph.

    ``W_ij = 1 / (1 + max(d_i, d_j))`` for neighbours ``i ~ j`` (``d`` the degrees),
    ``W_ij = 0`` for non-neighbours and ``W_ii = 1 - sum_{j != i} W_ij``.

    Parameters
    ----------
    graph : Graph or array_like, shape (m, m)
        A graph, or an adjacency matrix; either is validated as in :func:`from_adjacency`.

    Returns
    -------
    W : ndarray of float64, shape (m, m)
        Exactly symmetric, nonnegative, rows and columns summing to 1 (doubly stochastic), one-hop,
        with ``W_ii >= 1 / (1 + d_i) > 0``; hence, the graph being connected, the eigenvalue 1 is
        simple and every other eigenvalue lies in ``(-1, 1)`` (:func:`spectral_gap` ``> 0``).

    References
    ----------
    Xiao & Boyd (2004), "Fast linear iterations for distributed averaging" (Metropolis-Hastings
    weights).
    """
    adj = as_adjacency(graph.adjacency if isinstance(graph, Graph) else graph)
    deg = adj.sum(axis=1).astype(np.float64)
    w = np.where(adj, 1.0 / (1.0 + np.maximum.outer(deg, deg)), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def _check_mixing(w) -> np.ndarray:
    arr = np.asarray(w, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise ValueError(f"mixing matrix must be a non-empty square (m, m) array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("mixing matrix has non-finite entries")
    if not np.allclose(arr, arr.T, rtol=0.0, atol=MIXING_ATOL):
        raise ValueError("mixing matrix must be symmetric")
    if not np.allclose(arr.sum(axis=1), 1.0, rtol=0.0, atol=MIXING_ATOL):
        raise ValueError("mixing matrix rows must sum to 1 (doubly stochastic)")
    return arr


def spectral_gap(w) -> float:
    """Spectral gap ``1 - max_{k >= 2} |lambda_k|`` of a symmetric doubly stochastic matrix.

    ``lambda_1 = 1`` (eigenvector the all-ones vector) is left out and the largest modulus of the
    remaining eigenvalues (the second-largest eigenvalue modulus, SLEM) subtracted from 1. The gap
    is positive iff ``W^k`` converges to the averaging matrix ``11^T / m``, and then
    ``||W^k x - mean(x) 1|| <= (1 - gap)^k ||x - mean(x) 1||``.

    Parameters
    ----------
    w : array_like, shape (m, m)
        Symmetric, rows summing to 1 (checked to ``MIXING_ATOL``).

    Returns
    -------
    float
        The gap, in ``[0, 1]`` for a nonnegative ``W`` (may be slightly negative for a signed
        ``W`` that does not converge); ``1.0`` for a single agent.
    """
    arr = _check_mixing(w)
    if arr.shape[0] == 1:
        return 1.0
    eig = np.linalg.eigvalsh(0.5 * (arr + arr.T))  # ascending; eig[-1] is the eigenvalue 1
    slem = max(abs(eig[0]), abs(eig[-2]))
    return float(1.0 - slem)


def rounds_for(w, tolerance: float = 0.01, cap: int = 100) -> int:
    """Mixing rounds ``s`` after which ``W^s`` keeps at most ``tolerance`` of any disagreement
    between agents: the least ``s >= 1`` with ``(1 - gap)^s <= tolerance`` (see
    :func:`spectral_gap`), capped at ``cap``. A complete graph (``W = 11^T / m``) needs 1; a ring
    of 5 needs 8; a ring of 8, 22; a path of 5, 35.
    """
    slem = 1.0 - spectral_gap(w)
    if slem <= tolerance:
        return 1
    return int(min(cap, max(1, math.ceil(math.log(tolerance) / math.log(slem)))))


def mix(w, values, rounds: int = 1) -> np.ndarray:
    """``rounds`` gossip rounds: ``W^rounds`` applied along the agent axis of stacked values.

    Agent ``i`` ends with ``sum_j (W^rounds)_ij values[j]``.

    Parameters
    ----------
    w : array_like, shape (m, m)
        Mixing matrix (e.g. :func:`metropolis_weights`); only its shape is checked here.
    values : array_like, shape (m, ...)
        One value (scalar or array) per agent, stacked along the first axis.
    rounds : int, optional
        Number of rounds, ``>= 0`` (0 returns a copy of ``values``).

    Returns
    -------
    ndarray, shape (m, ...)
        Same dtype as ``values`` if that is floating, float64 otherwise.
    """
    arr_w = np.asarray(w, dtype=np.float64)
    vals = np.asarray(values)
    if arr_w.ndim != 2 or arr_w.shape[0] != arr_w.shape[1]:
        raise ValueError(f"mixing matrix must be square (m, m), got shape {arr_w.shape}")
    if vals.ndim < 1 or vals.shape[0] != arr_w.shape[0]:
        raise ValueError(f"values must stack one entry per agent along axis 0: expected "
                         f"{arr_w.shape[0]} agents, got shape {vals.shape}")
    rounds = check_count(rounds, "rounds", minimum=0)
    dtype = vals.dtype if np.issubdtype(vals.dtype, np.floating) else np.float64
    power = np.linalg.matrix_power(arr_w, rounds)
    out = np.tensordot(power, vals.astype(np.float64, copy=False), axes=(1, 0))
    return out.astype(dtype, copy=False)
