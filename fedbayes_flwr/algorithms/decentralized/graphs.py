"""Communication graphs for decentralized algorithms (their mixing: :mod:`.mixing`).

Pure numpy/scipy. Agents ``0 .. m-1`` sit on an undirected, connected, loop-free graph stored
as a boolean ``(m, m)`` adjacency matrix (:class:`Graph`); one gossip round replaces every
agent's value by a weighted average of its own and its neighbours' values, ``x <- W x``, with a
symmetric, doubly stochastic mixing matrix ``W`` that is one-hop (``W_ij = 0`` unless ``i = j``
or ``i ~ j``).

* Graph constructors: :func:`ring`, :func:`path`, :func:`torus`, :func:`erdos_renyi`,
  :func:`complete` and :func:`from_adjacency` (a user matrix, validated); :func:`make_graph`
  parses the string key of the run config (``dhmc.graph``, syntax below).
* The mixing matrices over a graph are in :mod:`fedbayes_flwr.algorithms.decentralized.mixing`.
* :func:`is_connected`.

Every graph that leaves this module has been validated: square, binary, symmetric, zero diagonal
and connected; anything else raises ``ValueError`` saying what is wrong. ``Graph.neighbours`` has
the ``{agent: (neighbour, ...)}`` layout :func:`fedbayes_flwr.algorithms.decentralized.routing.route` expects.

Graph keys (:func:`make_graph`, case-insensitive, surrounding spaces ignored)
-----------------------------------------------------------------------------
``"ring"``
    Cycle ``0 - 1 - ... - (m-1) - 0``; for ``m <= 2`` the cycle would repeat an edge, so the
    path on ``m`` agents is returned instead.
``"path"``
    Line ``0 - 1 - ... - (m-1)``.
``"torus"``, ``"torus:RxC"``
    2-D torus (grid with wraparound), agent ``r * C + c`` at row ``r``, column ``c``. Without
    ``RxC`` the most nearly square factorisation ``m = R * C`` with ``R <= C`` is used (a prime
    ``m`` gives ``1 x m``, i.e. a ring). With it, ``R * C`` must equal ``m``.
``"complete"``
    Every pair of agents connected.
``"erdos-renyi:P"`` (also ``"erdos_renyi:P"``, ``"er:P"``)
    Each edge present independently with probability ``P``, drawn with ``seed``; a disconnected
    draw raises ``ValueError`` (no silent redraw, so a seed always means the same graph).
``"file:PATH"``
    Adjacency matrix read from ``PATH``: ``.npy`` (``numpy.save``), ``.json`` (nested lists) or
    any other extension as text (``.csv`` comma separated, otherwise whitespace separated).
``"[[0,1],[1,0]]"``
    A JSON adjacency literal (any key starting with ``[``).

A user adjacency (file or literal) must be ``m x m``.

References
----------
Xiao & Boyd (2004), "Fast linear iterations for distributed averaging", Systems & Control Letters
53(1), 65-78: the Metropolis-Hastings weights ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges,
``W_ii = 1 - sum_j W_ij``, and convergence of ``W^k x`` to the average at the rate of the
second-largest eigenvalue modulus of a symmetric ``W``.

"Decentralized Bayesian Learning with Metropolis-Adjusted Hamiltonian Monte Carlo" (seed 004):
agents on a communication graph mix parameters and tracked gradients with a doubly stochastic
matrix, taking several mixing rounds per iteration for consensus.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

__all__ = [
    "Graph",
    "complete",
    "erdos_renyi",
    "from_adjacency",
    "is_connected",
    "make_graph",
    "path",
    "ring",
    "torus",
]


class Graph(NamedTuple):
    """An undirected, connected, loop-free communication graph over agents ``0 .. m-1``.

    Build one with a constructor of this module (which validates it) rather than directly.

    Attributes
    ----------
    adjacency : ndarray of bool, shape (m, m)
        ``adjacency[i, j]`` is true iff agents ``i`` and ``j`` exchange messages; symmetric,
        false on the diagonal. Read-only.
    name : str
        A label: ``"ring"``, ``"path"``, ``"torus:RxC"``, ``"erdos-renyi:P"``, ``"complete"`` or
        ``"adjacency"``.
    """

    adjacency: np.ndarray
    name: str

    @property
    def size(self) -> int:
        """Number of agents ``m``."""
        return int(self.adjacency.shape[0])

    @property
    def degrees(self) -> np.ndarray:
        """Number of neighbours of each agent, an int array of shape ``(m,)``."""
        return self.adjacency.sum(axis=1).astype(np.int64)

    @property
    def neighbours(self) -> dict[int, tuple[int, ...]]:
        """``{agent: (neighbour, ...)}`` in increasing order, the layout of ``routing.route``."""
        return {i: tuple(int(j) for j in np.flatnonzero(row)) for i, row in enumerate(self.adjacency)}


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

def check_count(value, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return int(value)


def as_adjacency(matrix) -> np.ndarray:
    """Validate a 0/1 adjacency matrix and return it as a read-only bool array (copy)."""
    try:
        arr = np.asarray(matrix)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"adjacency must be a square matrix; could not read it as an array ({exc})"
                         ) from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"adjacency must be a square (m, m) matrix, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("adjacency must have at least one agent, got shape (0, 0)")
    if arr.dtype != np.bool_:
        if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise ValueError(f"adjacency entries must be 0/1 numbers or booleans, got dtype {arr.dtype}")
        bad = ~((arr == 0) | (arr == 1))
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad)[0])
            raise ValueError(f"adjacency must be binary (0/1); entry [{i}, {j}] is {arr[i, j]!r} "
                             f"({int(bad.sum())} non-binary entries)")
        arr = arr == 1
    diag = np.flatnonzero(np.diagonal(arr))
    if diag.size:
        raise ValueError(f"adjacency must have a zero diagonal (no self-loops); agents "
                         f"{diag.tolist()} are connected to themselves")
    asym = np.argwhere(arr != arr.T)
    if asym.size:
        i, j = (int(k) for k in asym[0])
        raise ValueError(f"adjacency must be symmetric (undirected graph); entry [{i}, {j}] is "
                         f"{int(arr[i, j])} but [{j}, {i}] is {int(arr[j, i])}")
    n_comp, labels = connected_components(csr_array(arr), directed=False)
    if n_comp > 1:
        isolated = np.flatnonzero(labels != labels[0])
        raise ValueError(f"graph must be connected, but it has {n_comp} connected components "
                         f"(agents {_preview(isolated)} cannot reach agent 0)")
    out = arr.copy()
    out.setflags(write=False)
    return out


def _preview(indices: np.ndarray, limit: int = 8) -> str:
    shown = [int(k) for k in indices[:limit]]
    return str(shown) if indices.size <= limit else f"{str(shown)[:-1]}, ...] ({indices.size} in all)"


def is_connected(adjacency) -> bool:
    """Whether the undirected graph with this adjacency matrix is connected.

    Parameters
    ----------
    adjacency : array_like, shape (m, m)
        Nonzero entries are edges; directions are ignored (weak connectivity).

    Returns
    -------
    bool
        ``True`` iff every agent can reach every other; ``False`` for an empty matrix.
    """
    arr = np.asarray(adjacency)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"adjacency must be a square (m, m) matrix, got shape {arr.shape}")
    if arr.shape[0] == 0:
        return False
    n_comp, _ = connected_components(csr_array(arr != 0), directed=False)
    return bool(n_comp == 1)


# --------------------------------------------------------------------------------------------
# Constructors
# --------------------------------------------------------------------------------------------

def from_adjacency(matrix, name: str = "adjacency") -> Graph:
    """A graph from a user adjacency matrix, validated.

    Parameters
    ----------
    matrix : array_like, shape (m, m)
        Booleans or the numbers 0 and 1.
    name : str, optional
        Label stored on the graph.

    Returns
    -------
    Graph

    Raises
    ------
    ValueError
        If the matrix is not square (or is empty), has entries other than 0/1, is not symmetric,
        has a nonzero diagonal (self-loop) or describes a disconnected graph; the message names
        the offending entry or agents.
    """
    return Graph(as_adjacency(matrix), name)


def path(m: int) -> Graph:
    """Path (line) graph ``0 - 1 - ... - (m-1)``, ``m >= 1``: end degrees 1, inner degrees 2."""
    m = check_count(m, "path size m")
    adj = np.zeros((m, m), dtype=bool)
    idx = np.arange(m - 1)
    adj[idx, idx + 1] = adj[idx + 1, idx] = True
    return from_adjacency(adj, "path")


def ring(m: int) -> Graph:
    """Ring (cycle) graph ``0 - 1 - ... - (m-1) - 0``: every degree 2.

    For ``m <= 2`` the cycle would repeat the edge ``0 - 1`` (or be a self-loop), so the path on
    ``m`` agents is returned (named ``"path"``).
    """
    m = check_count(m, "ring size m")
    if m <= 2:
        return path(m)
    adj = np.zeros((m, m), dtype=bool)
    idx = np.arange(m)
    adj[idx, (idx + 1) % m] = adj[(idx + 1) % m, idx] = True
    return from_adjacency(adj, "ring")


def torus(rows: int, cols: int) -> Graph:
    """2-D torus: a ``rows x cols`` grid with wraparound; agent ``r * cols + c`` at ``(r, c)``.

    Each agent links to its up, down, left and right neighbours modulo the grid size, so for
    ``rows, cols >= 3`` every degree is 4. Small sizes lose coinciding links rather than
    duplicating them: a side of length 2 contributes one neighbour along it (up = down), a side
    of length 1 none (no self-loop). ``1 x n`` is thus the ring on ``n`` agents, ``2 x 2`` the
    4-cycle.
    """
    rows = check_count(rows, "torus rows")
    cols = check_count(cols, "torus cols")
    adj = np.zeros((rows * cols, rows * cols), dtype=bool)
    r, c = np.divmod(np.arange(rows * cols), cols)
    for dr, dc in ((1, 0), (0, 1)):
        other = ((r + dr) % rows) * cols + (c + dc) % cols
        adj[np.arange(rows * cols), other] = True
        adj[other, np.arange(rows * cols)] = True
    np.fill_diagonal(adj, False)
    return from_adjacency(adj, f"torus:{rows}x{cols}")


def complete(m: int) -> Graph:
    """Complete graph on ``m >= 1`` agents: every degree ``m - 1``."""
    m = check_count(m, "complete graph size m")
    adj = ~np.eye(m, dtype=bool)
    return from_adjacency(adj, "complete")


def erdos_renyi(m: int, p: float, seed: int) -> Graph:
    """Erdos-Renyi graph ``G(m, p)``: each of the ``m (m-1) / 2`` edges present with probability ``p``.

    Parameters
    ----------
    m : int
        Number of agents, ``>= 1``.
    p : float
        Edge probability in ``[0, 1]``. The graph is connected with high probability once ``p``
        clearly exceeds ``log(m) / m``.
    seed : int
        Seed of ``numpy.random.default_rng``; the same ``(m, p, seed)`` always gives the same
        graph.

    Returns
    -------
    Graph

    Raises
    ------
    ValueError
        If ``p`` is outside ``[0, 1]``, or the drawn graph is disconnected (the message names
        ``m``, ``p`` and ``seed`` and suggests a larger ``p`` or another seed).
    """
    m = check_count(m, "Erdos-Renyi size m")
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"Erdos-Renyi edge probability p must be a number in [0, 1], got {p!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"Erdos-Renyi seed must be an integer, got {seed!r}")
    p = float(p)
    rng = np.random.default_rng(int(seed))
    upper = np.triu(rng.random((m, m)) < p, k=1)
    adj = upper | upper.T
    if not is_connected(adj):
        n_comp, _ = connected_components(csr_array(adj), directed=False)
        hint = min(1.0, 2.0 * math.log(m) / m) if m > 1 else 1.0
        raise ValueError(
            f"Erdos-Renyi graph with m={m}, p={p:g}, seed={seed} is disconnected "
            f"({n_comp} connected components); use a larger p (e.g. p >= {hint:.2g}, about "
            f"2 log(m) / m) or another seed")
    return from_adjacency(adj, f"erdos-renyi:{p:g}")


# --------------------------------------------------------------------------------------------
# Run-config key
# --------------------------------------------------------------------------------------------

_ER_NAMES = ("erdos-renyi", "erdos_renyi", "erdosrenyi", "er")
_SYNTAX = ('"ring", "path", "complete", "torus", "torus:RxC", "erdos-renyi:P", "file:PATH" or a '
           'JSON adjacency literal such as "[[0,1],[1,0]]"')


def _near_square(m: int) -> tuple[int, int]:
    rows = max(d for d in range(1, math.isqrt(m) + 1) if m % d == 0)
    return rows, m // rows


def _load_adjacency(file: str):
    p = Path(file).expanduser()
    if not p.is_file():
        raise ValueError(f"graph adjacency file {str(p)!r} does not exist")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            return np.load(p, allow_pickle=False)
        if suffix == ".json":
            return json.loads(p.read_text())
        return np.loadtxt(p, delimiter="," if suffix == ".csv" else None, ndmin=2)
    except (OSError, ValueError) as exc:
        raise ValueError(f"could not read graph adjacency file {str(p)!r}: {exc}") from None


def make_graph(spec: str, m: int, seed: int = 0) -> Graph:
    """The graph named by a run-config key (``dhmc.graph``); syntax in the module docstring.

    Parameters
    ----------
    spec : str
        ``"ring"``, ``"path"``, ``"complete"``, ``"torus"``, ``"torus:RxC"``,
        ``"erdos-renyi:P"``, ``"file:PATH"`` or a JSON adjacency literal ``"[[0,1],[1,0]]"``.
        Case-insensitive (except ``PATH``); surrounding spaces are ignored.
    m : int
        Number of agents; a torus ``RxC`` or a user adjacency must match it.
    seed : int, optional
        Seed of the Erdos-Renyi draw; ignored by the other graphs.

    Returns
    -------
    Graph

    Raises
    ------
    ValueError
        For an unknown key, a malformed parameter, a size that does not match ``m``, or an
        invalid graph (see :func:`from_adjacency` and :func:`erdos_renyi`).
    """
    if not isinstance(spec, str):
        raise ValueError(f"graph spec must be a string ({_SYNTAX}), got {spec!r}")
    m = check_count(m, "number of agents m")
    text = spec.strip()
    if text.startswith("["):
        try:
            matrix = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"graph spec {spec!r} is not a valid JSON adjacency literal: {exc}"
                             ) from None
        return _sized(from_adjacency(matrix), m, spec)
    kind, sep, arg = text.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind == "file":
        if not arg:
            raise ValueError(f"graph spec {spec!r} needs a path: \"file:PATH\"")
        return _sized(from_adjacency(_load_adjacency(arg)), m, spec)
    if kind in ("ring", "path", "complete"):
        if sep:
            raise ValueError(f"graph {kind!r} takes no parameter, got {spec!r}")
        return {"ring": ring, "path": path, "complete": complete}[kind](m)
    if kind == "torus":
        if not sep:
            return torus(*_near_square(m))
        parts = arg.lower().split("x")
        if len(parts) != 2 or not all(s.strip().isdigit() for s in parts):
            raise ValueError(f"graph spec {spec!r}: torus size must look like \"torus:RxC\" "
                             f"(e.g. \"torus:2x3\")")
        rows, cols = (int(s) for s in parts)
        if rows * cols != m:
            raise ValueError(f"graph spec {spec!r}: a {rows}x{cols} torus has {rows * cols} agents "
                             f"but there are m={m}")
        return torus(rows, cols)
    if kind in _ER_NAMES:
        if not arg:
            raise ValueError(f"graph spec {spec!r}: Erdos-Renyi needs an edge probability, "
                             f"e.g. \"erdos-renyi:0.5\"")
        try:
            p = float(arg)
        except ValueError:
            raise ValueError(f"graph spec {spec!r}: Erdos-Renyi edge probability {arg!r} is not a "
                             f"number") from None
        return erdos_renyi(m, p, seed)
    raise ValueError(f"unknown graph spec {spec!r}; expected {_SYNTAX}")


def induced(graph: Graph, keep) -> Graph:
    """The subgraph on the agents ``keep`` (relabelled ``0 .. len(keep) - 1`` in that order):
    what remains of the graph when the other agents drop out.

    Raises
    ------
    ValueError
        If ``keep`` is empty, names an unknown or repeated agent, or leaves a disconnected graph
        (the message lists the pieces, in the original labels).
    """
    keep = [int(k) for k in keep]
    if not keep:
        raise ValueError("no agent left")
    if len(set(keep)) != len(keep) or min(keep) < 0 or max(keep) >= graph.size:
        raise ValueError(f"agents {keep} are not distinct agents of a graph of {graph.size}")
    sub = graph.adjacency[np.ix_(keep, keep)]
    n_comp, labels = connected_components(csr_array(sub), directed=False)
    if n_comp > 1:
        pieces = [[keep[i] for i in np.flatnonzero(labels == c)] for c in range(n_comp)]
        raise ValueError(f"the remaining graph is disconnected: {' | '.join(map(str, pieces))}")
    return Graph(sub.copy(), f"{graph.name} without {sorted(set(range(graph.size)) - set(keep))}")


def _sized(graph: Graph, m: int, spec: str) -> Graph:
    if graph.size != m:
        raise ValueError(f"graph spec {spec!r} gives an adjacency for {graph.size} agents but "
                         f"there are m={m}")
    return graph


# --------------------------------------------------------------------------------------------
# Mixing
# --------------------------------------------------------------------------------------------


