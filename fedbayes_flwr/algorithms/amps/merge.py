"""AMPS: merging clients' mean-field posteriors after aligning their component labels.

Notation: ``N`` clients, ``lambda_0`` the prior's parameters, ``lambda_i`` client ``i``'s posterior
(a NamedTuple of :mod:`fedbayes_flwr.inference.expfam` blocks), ``K`` components on axis 0 of the
*symmetric* blocks (coupled: one permutation per client moves them together).

**Naive merge** (Campbell & How 2014, eq. 3; Broderick et al. 2013): Bayes' rule for
conditionally independent data in natural parameters,

    lambda = (1 - N) lambda_0 + sum_i lambda_i.

**AMPS** (eqs. 10-12): choose a permutation ``P_i`` of each client's components to maximise

    J({P_i}) = sum_j A_j((1 - N) lambda_0j + sum_i P_i lambda_ij),

the log weight of the best-aligned term of the symmetrised product (``A_j`` the log-partition of
block ``j``), then merge with those permutations. ``J`` is a convex function maximised over
permutations: every search here is a local search without an optimality guarantee. ``J`` is
unchanged by a common relabelling of the merged components, so results are normalised to
``P_1 = I``. Two searches, both starting from the identity (the naive merge) and both
monotone, so ``J(amps) >= J(naive)``:

* ``swap`` (the paper's Section 3.1 search): for client ``i = 1..N`` in order and every pair
  ``a < b`` in lexicographic order, swap the client's components ``a`` and ``b`` when that raises
  ``J`` by more than ``tol |J|``; stop after a full pass without a gain.
* ``bipartite`` (the paper's Section 3.2 search): for each client ``i`` in order, take its
  posterior out of the merge, ``lambda_-i = lambda - P_i lambda_i``, and solve the maximum-weight
  assignment with edge weights ``w_kk' = A_k(lambda_-i,k + lambda_i,k')`` (the per-component terms of
  the symmetric blocks; the terms that do not change under permutation, such as a weight
  Dirichlet's ``-lgamma(sum_k alpha_k)``, drop out) by
  ``scipy.optimize.linear_sum_assignment(w, maximize=True)``; put it back; stop when a sweep over
  all clients raises ``J`` by no more than ``tol |J|``. Each assignment is optimal given the
  others, so ``J`` never falls.

:func:`brute_force` enumerates every combination for small problems (tests).

Convention: ``perms[i][k]`` is the component of client ``i`` that goes to merged component ``k``.

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", eq. (3) (naive merge),
eqs. (7)-(12) (the AMPS objective), Sections 3.1 (pairwise swaps) and 3.2 (iterative bipartite
matching); Broderick et al. (2013), "Streaming Variational Bayes", eq. (2); Kuhn (1955) / Crouse
(2016) for the assignment problem solved by :func:`scipy.optimize.linear_sum_assignment`.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import bounds
from fedbayes_flwr.inference import expfam

__all__ = ["SEARCHES", "Alignment", "align", "brute_force", "contribution_error",
           "matched_error", "merge", "objective"]

SEARCHES = ("bipartite", "swap")
BRUTE_FORCE_LIMIT = 200_000


class Alignment(NamedTuple):
    """A search's result.

    Attributes
    ----------
    perms : numpy.ndarray
        ``(N, K)`` int, ``perms[0]`` the identity.
    objective : float
        ``J`` at ``perms``.
    naive_objective : float
        ``J`` at the identity (the naive merge).
    sweeps : int
        Full passes over the clients.
    evaluations : int
        Objective evaluations (swaps tried, or assignment problems solved).
    """

    perms: np.ndarray
    objective: float
    naive_objective: float
    sweeps: int
    evaluations: int


def _num_components(params, symmetric) -> int:
    sizes = {int(np.asarray(block[0]).shape[0])
             for name, block in expfam.blocks(params).items() if name in symmetric}
    if len(sizes) > 1:
        raise ValueError(f"symmetric blocks {symmetric} have different component counts {sizes}")
    return sizes.pop() if sizes else 1


def merge(prior, posteriors: list, perms=None, symmetric: tuple[str, ...] = ()) -> Any:
    """``(1 - N) prior + sum_i P_i posteriors[i]`` (``perms`` None: the naive merge).

    ``prior`` is whatever the clients' posteriors were fitted from: ``lambda_0``, or in streaming
    use a merged posterior of earlier batches.
    """
    if not posteriors:
        return prior
    if perms is not None:
        posteriors = [expfam.permute(p, perm, symmetric) for p, perm in zip(posteriors, perms,
                                                                            strict=True)]
    n = len(posteriors)
    return expfam.combine([prior, *posteriors], [1.0 - n] + [1.0] * n)


def objective(prior, posteriors: list, perms=None, symmetric: tuple[str, ...] = ()) -> float:
    """``J``: the total log-partition of the merge (NaN when the merge leaves the domain)."""
    return expfam.total_log_partition(merge(prior, posteriors, perms, symmetric))


def _symmetric_terms(params, symmetric, idx=None) -> np.ndarray:
    """Per-component log-partition terms summed over the symmetric blocks (components ``idx``)."""
    total = 0.0
    for name, block in expfam.blocks(params).items():
        if name not in symmetric:
            continue
        part = block if idx is None else type(block)(*(np.asarray(a)[idx] for a in block))
        total = total + expfam.log_partition(part)[0]
    return np.asarray(total, dtype=np.float64)


def _normalise(perms: np.ndarray) -> np.ndarray:
    """Relabel the merged components so that ``perms[0]`` is the identity (``J`` unchanged)."""
    return perms[:, np.argsort(perms[0])]


def _check_inputs(prior, posteriors, search):
    if search not in SEARCHES:
        raise ValueError(f"unknown AMPS search {search!r}; choose one of {', '.join(SEARCHES)}")
    if not posteriors:
        raise ValueError("AMPS needs at least one client posterior")


def align(prior, posteriors: list, symmetric: tuple[str, ...] = (), search: str = "bipartite",
          tol: float = 1e-12, max_sweeps: int = 100) -> Alignment:
    """Choose each client's permutation to maximise ``J`` (module docstring).

    Parameters
    ----------
    prior, posteriors
        The prior the clients fitted from and their posteriors (same block structure).
    symmetric : tuple of str
        Fields of the posterior NamedTuple permuted together; empty: nothing to align.
    search : {"bipartite", "swap"}
    tol : float
        A step counts as a gain when it raises ``J`` by more than ``tol * max(1, |J|)``.
    max_sweeps : int
        Upper bound on full passes over the clients.
    """
    _check_inputs(prior, posteriors, search)
    n = len(posteriors)
    k = _num_components(prior, symmetric) if symmetric else 1
    perms = np.tile(np.arange(k), (n, 1))
    naive = objective(prior, posteriors, None, symmetric)
    if not symmetric or k == 1 or n == 1:
        return Alignment(perms, naive, naive, 0, 0)
    if search == "swap":
        return _swap_search(prior, posteriors, symmetric, perms, naive, tol, max_sweeps)
    return _bipartite_search(prior, posteriors, symmetric, perms, naive, tol, max_sweeps)


def _swap_search(prior, posteriors, symmetric, perms, naive, tol, max_sweeps) -> Alignment:
    merged = merge(prior, posteriors, perms, symmetric)
    value, evaluations, sweeps = naive, 0, 0
    k = perms.shape[1]
    while sweeps < max_sweeps:
        sweeps += 1
        improved = False
        for i, post in enumerate(posteriors):
            for a, b in itertools.combinations(range(k), 2):
                evaluations += 1
                swapped = perms[i].copy()
                swapped[[a, b]] = swapped[[b, a]]
                # only merged components a and b change: J moves by their terms' change
                idx = np.array([a, b])
                mine_old = expfam.permute(post, perms[i], symmetric)
                mine_new = expfam.permute(post, swapped, symmetric)
                candidate = expfam.combine([merged, mine_old, mine_new], [1.0, -1.0, 1.0])
                gain = float(np.sum(_symmetric_terms(candidate, symmetric, idx))
                             - np.sum(_symmetric_terms(merged, symmetric, idx)))
                if gain > tol * max(1.0, abs(value)):
                    perms[i], merged, value = swapped, candidate, value + gain
                    improved = True
        if not improved:
            break
    perms = _normalise(perms)
    return Alignment(perms, objective(prior, posteriors, perms, symmetric), naive, sweeps,
                     evaluations)


def _bipartite_search(prior, posteriors, symmetric, perms, naive, tol, max_sweeps) -> Alignment:
    merged = merge(prior, posteriors, perms, symmetric)
    value, evaluations, sweeps = naive, 0, 0
    k = perms.shape[1]
    while sweeps < max_sweeps:
        sweeps += 1
        start = value
        for i, post in enumerate(posteriors):
            evaluations += 1
            rest = expfam.combine([merged, expfam.permute(post, perms[i], symmetric)], [1.0, -1.0])
            weights = np.empty((k, k))
            for col in range(k):
                # every merged component k takes the client's component `col`
                moved = expfam.permute(post, np.full(k, col), symmetric)
                weights[:, col] = _symmetric_terms(expfam.combine([rest, moved], [1.0, 1.0]),
                                                   symmetric)
            # an assignment leaving the domain (NaN) is never chosen over a valid one
            weights = np.where(np.isfinite(weights), weights, -1e300)
            from scipy.optimize import linear_sum_assignment  # lazy: deployed nodes import

            rows, cols = linear_sum_assignment(weights, maximize=True)
            new = cols[np.argsort(rows)]
            candidate = expfam.combine([rest, expfam.permute(post, new, symmetric)], [1.0, 1.0])
            new_value = expfam.total_log_partition(candidate)
            if np.isfinite(new_value) and new_value >= value:
                perms[i], merged, value = new, candidate, new_value
        if value - start <= tol * max(1.0, abs(value)):
            break
    perms = _normalise(perms)
    return Alignment(perms, objective(prior, posteriors, perms, symmetric), naive, sweeps,
                     evaluations)


def brute_force(prior, posteriors: list, symmetric: tuple[str, ...]) -> Alignment:
    """The global maximum of ``J`` by enumeration (``P_1 = I``; ``(K!)^(N-1)`` combinations)."""
    _check_inputs(prior, posteriors, "bipartite")
    n = len(posteriors)
    k = _num_components(prior, symmetric)
    count = math.factorial(k) ** (n - 1)
    if count > BRUTE_FORCE_LIMIT:
        raise ValueError(f"brute force over {count} combinations exceeds {BRUTE_FORCE_LIMIT}")
    naive = objective(prior, posteriors, None, symmetric)
    best, best_value = None, -np.inf
    for combo in itertools.product(itertools.permutations(range(k)), repeat=n - 1):
        perms = np.array([tuple(range(k)), *combo])
        value = objective(prior, posteriors, perms, symmetric)
        if value > best_value:
            best, best_value = perms, value
    return Alignment(best, best_value, naive, 1, count)


def contribution_error(prior, posterior, rtol: float = 1e-9) -> str | None:
    """Why ``posterior`` cannot be a posterior fitted from ``prior`` (None if it can).

    The posterior must lie in each block's domain and ``posterior - prior`` must be a valid
    likelihood contribution: non-negative added counts (Dirichlet, Beta) and non-negative added
    precision (Gaussian), to rounding (``rtol`` relative to the prior's scale).
    """
    post_blocks, prior_blocks = expfam.blocks(posterior), expfam.blocks(prior)
    for name, block in post_blocks.items():
        reason = expfam.domain_error(block, name or "posterior")
        if reason:
            return reason
        diff = expfam.combine([block, prior_blocks[name]], [1.0, -1.0])
        scale = max(1.0, max(float(np.max(np.abs(a))) for a in prior_blocks[name]))
        reason = expfam.domain_error(diff, f"{name or 'posterior'} - prior", atol=rtol * scale)
        if reason:
            return reason
    return None


def contribution_size_error(prior, posterior, num_examples: int) -> str | None:
    """Why ``posterior - prior`` is too large a likelihood contribution for ``num_examples``
    data (None if it is not): an entry above ``2**52 x num_examples x`` the prior block's scale
    (:func:`fedbayes_flwr.algorithms.bounds.contribution_error`: past it the prior is below
    float64's resolution of the merge, which becomes whatever the one client said)."""
    post_blocks, prior_blocks = expfam.blocks(posterior), expfam.blocks(prior)
    for name, block in post_blocks.items():
        diff = expfam.combine([block, prior_blocks[name]], [1.0, -1.0])
        scale = max(1.0, max(float(np.max(np.abs(a))) for a in prior_blocks[name]))
        reason = bounds.contribution_error(list(diff), scale, num_examples)
        if reason:
            return f"{name or 'posterior'} - prior: {reason}"
    return None


def matched_error(estimate: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-component 2-norm errors ``|estimate[perm[k]] - truth[k]|`` after the best relabelling
    (minimum total error, :func:`scipy.optimize.linear_sum_assignment`), and ``perm``."""
    estimate = np.asarray(estimate, dtype=np.float64).reshape(len(estimate), -1)
    truth = np.asarray(truth, dtype=np.float64).reshape(len(truth), -1)
    if estimate.shape != truth.shape:
        raise ValueError(f"estimate {estimate.shape} and truth {truth.shape} differ in shape")
    cost = np.linalg.norm(truth[:, None, :] - estimate[None, :, :], axis=-1)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    perm = cols[np.argsort(rows)]
    return cost[np.arange(len(truth)), perm], perm
