r"""The agreed mass matrix of decentralized MH-HMC: warm-up windows, sufficient statistics and the
regularised estimate (numpy).

``dhmc.mass-matrix`` = ``none`` (unit mass, the paper's), ``diagonal``, ``dense`` or ``auto``
(:func:`resolve`). With a mass matrix ``M`` the momentum is drawn ``p ~ N(0, M)``, the position
moves by ``epsilon M^{-1} p`` and the kinetic energy is ``p^T M^{-1} p / 2``
(:mod:`fedbayes_flwr.algorithms.dhmc.agents`); what is estimated and stored is the INVERSE mass
``M^{-1}``, an estimate of the posterior covariance (its diagonal for ``diagonal``).

**Windows** (Stan's windowed adaptation, :func:`windows`): of ``W`` warm-up iterations an initial
fast buffer (75; only the step size adapts), slow windows of 25, 50, 100, ... iterations (the
last stretched to the end of the slow part) and a terminal fast buffer (50); when ``W < 150``
the buffers are 15% and 10% of ``W``; below 20 warm-up iterations there is no adaptation (unit
mass). In a slow window every agent adds its own iterate of every chain after each iteration to
its sufficient statistics ``(n, sum w, sum w w^T)`` (``sum w_j^2`` per coordinate for
``diagonal``).

**Agreement.** At the iteration that follows a window, the agents' statistics ride along the
iteration's gossip exchanges (the same Metropolis-Hastings mixing ``W^s`` as the proposals and
trackers: it keeps their network average exact, and the agents' copies were already near-equal
since every agent sees the same chains), then the decision's flooding phase floods the
lowest-numbered agent's mixed statistics (after ``D`` rounds every agent holds that agent's,
bit for bit: a selection, no arithmetic), and every agent computes the same estimate from the
same numbers. So all agents hold an IDENTICAL ``M`` from the next iteration on (tested), and
after the last window ``M`` is fixed for sampling. The shared step size's dual averaging
restarts after each window (the server does it), as Stan's does.

**Estimate** (:func:`estimate`, Stan's regularisation towards a small multiple of the identity):
``(n / (n + 5)) Sigma_hat + 1e-3 (5 / (n + 5)) I`` with ``Sigma_hat`` the sample covariance
(its diagonal for ``diagonal``) of the window's ``n`` draws (all chains pooled).

References
----------
Stan Development Team, "Stan Reference Manual", section "HMC algorithm parameters / Automatic
parameter tuning" (windowed adaptation: buffers 75 / 25 / 50, doubling windows) and
``stan/mcmc/windowed_adaptation.hpp``, ``var_adaptation.hpp``, ``covar_adaptation.hpp`` (the
regularised estimate); Neal (2011), "MCMC using Hamiltonian dynamics", Section 4.1 (the mass
matrix: ``K(p) = p^T M^{-1} p / 2``); Lynch (1996), "Distributed Algorithms", Section 4.1
(flooding).
"""

from __future__ import annotations

import numpy as np

KINDS = ("none", "diagonal", "dense", "auto")
INIT_BUFFER, TERM_BUFFER, BASE_WINDOW = 75, 50, 25
MIN_WARMUP = 20
AUTO_DENSE_MAX_DIM = 200  # auto: diagonal above this dimension (d^2 statistics per message)
AUTO_DRAWS_PER_DIM = 10  # auto: dense only with at least 10 d draws in the last window


def windows(warmup: int) -> tuple[tuple[int, int], ...]:
    """The slow windows ``((start, end), ...)`` (iterations ``start <= t < end``) of a warm-up of
    ``warmup`` iterations (module docstring; Stan's ``windowed_adaptation``)."""
    if warmup < MIN_WARMUP:
        return ()
    init, term, base = INIT_BUFFER, TERM_BUFFER, BASE_WINDOW
    if init + term + base > warmup:
        init, term = int(0.15 * warmup), int(0.1 * warmup)
        base = warmup - init - term
    slow_end = warmup - term
    out, start, size = [], init, base
    while start < slow_end:
        end = start + size
        if end + 2 * size > slow_end:
            end = slow_end
        out.append((start, end))
        start, size = end, 2 * size
    return tuple(out)


def window_ends(warmup: int) -> frozenset:
    """The iterations at which the agents agree a new matrix (the first after each window)."""
    return frozenset(end for _, end in windows(warmup))


def resolve(kind: str, dim: int, warmup: int, chains: int, decision: str = "agree",
            adapt: bool = True) -> str:
    """``none``, ``diagonal`` or ``dense``: ``kind`` itself unless ``auto``, which is ``none``
    without slow windows (``warmup < 20``), with local decisions (no flooding phase to agree
    the matrix) or without step size adaptation (``adapt`` False: a fixed step was chosen for
    unit mass, and a new ``M`` would change what it means; Stan's ``adapt engaged = false``
    turns both off), ``diagonal`` when ``d > 200`` or the last window has fewer than ``10 d`` draws
    (``chains`` x its length: a dense estimate would be ill-conditioned), else ``dense``
    (the benchmark's choice, docs/families/dhmc.md)."""
    if kind != "auto":
        return kind
    wins = windows(warmup)
    if not wins or decision != "agree" or not adapt:
        return "none"
    start, end = wins[-1]
    if dim > AUTO_DENSE_MAX_DIM or chains * (end - start) < AUTO_DRAWS_PER_DIM * dim:
        return "diagonal"
    return "dense"


def num_stats(kind: str, dim: int) -> int:
    """Length of the statistics vector ``[n, sum w, sum of squares / products]``."""
    if kind == "none":
        return 0
    return 1 + dim + (dim if kind == "diagonal" else dim * (dim + 1) // 2)


def add(stats: np.ndarray, w: np.ndarray, kind: str) -> np.ndarray:
    """``stats`` plus the draws ``w (K, d)`` (one per chain)."""
    d = w.shape[-1]
    second = (np.sum(w * w, axis=0) if kind == "diagonal"
              else (w.T @ w)[np.triu_indices(d)])
    return stats + np.concatenate([[w.shape[0]], w.sum(axis=0), second])


def estimate(stats: np.ndarray, kind: str, dim: int) -> np.ndarray:
    """The regularised inverse mass ``(n / (n + 5)) Sigma_hat + 1e-3 (5 / (n + 5)) I`` from
    ``stats``: ``(d,)`` for ``diagonal``, ``(d, d)`` for ``dense`` (module docstring)."""
    n = float(stats[0])
    mean = stats[1:1 + dim] / n
    rest = stats[1 + dim:]
    if kind == "diagonal":
        var = (rest - n * mean**2) / (n - 1)
        return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))
    second = np.zeros((dim, dim))
    second[np.triu_indices(dim)] = rest
    second = second + np.triu(second, 1).T
    cov = (second - n * np.outer(mean, mean)) / (n - 1)
    return (n / (n + 5.0)) * cov + 1e-3 * (5.0 / (n + 5.0)) * np.eye(dim)


def factor(inv_mass: np.ndarray) -> np.ndarray:
    """What the momentum draw needs: ``1 / sqrt(M^{-1})`` (diagonal), or the lower Cholesky
    factor ``C`` of ``M^{-1} = C C^T`` (dense: ``p = C^{-T} xi`` has covariance ``M``)."""
    if inv_mass.ndim == 1:
        return 1.0 / np.sqrt(inv_mass)
    return np.linalg.cholesky(inv_mass)


def pack(stats: np.ndarray, rows: int, width: int, lead: float = 0.0) -> np.ndarray:
    """``[lead, stats]`` laid out as a ``(rows, width)`` block of a broadcast (zero padded)."""
    flat = np.zeros(rows * width)
    flat[0] = lead
    flat[1:1 + stats.size] = stats
    return flat.reshape(rows, width)


def unpack(block: np.ndarray, size: int) -> tuple[float, np.ndarray]:
    """``(lead, stats)`` from a block made by :func:`pack`."""
    flat = block.reshape(-1)
    return float(flat[0]), flat[1:1 + size].copy()


def block_width(kind: str, dim: int, chains: int) -> int:
    """Columns the statistics add to every broadcast: ``ceil((1 + num_stats) / K)`` (0 for
    ``none``)."""
    size = num_stats(kind, dim)
    return 0 if size == 0 else -(-(size + 1) // chains)
