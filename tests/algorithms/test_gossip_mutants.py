"""Tests that kill the survivors of the decentralized family's mutation sweep
(``benchmarks/mutation/sweep.py --family decentralized --sample 100 --seed 0``,
``benchmarks/results/mutation/decentralized.json``); each names the mutant it kills."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedbayes_flwr.algorithms.decentralized import graphs as gs
from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
from fedbayes_flwr.algorithms.decentralized.routing import padded_inboxes


@pytest.mark.parametrize("shape", [(3, 2), (2, 3)])
def test_a_non_square_adjacency_is_refused_either_way(shape):
    """graphs.py as_adjacency: ``arr.shape[0] != arr.shape[1]`` mutated to ``<`` accepted a
    (3, 2) matrix (more rows than columns)."""
    with pytest.raises(ValueError, match=r"square \(m, m\) matrix, got shape"):
        gs.as_adjacency(np.zeros(shape, dtype=int))


def test_the_disconnected_erdos_renyi_hint_is_two_log_m_over_m():
    """graphs.py erdos_renyi: the hint ``2.0 * math.log(m) / m`` mutated to ``2.0 // ...`` said
    ``p >= 0``. With p = 0 every graph of m = 10 is disconnected; 2 ln(10) / 10 = 0.4605."""
    with pytest.raises(ValueError, match=r"p >= 0\.46,"):
        gs.erdos_renyi(10, 0.0, 0)


def test_a_pickled_adjacency_file_is_not_unpickled(tmp_path):
    """graphs.py _load_adjacency: ``np.load(p, allow_pickle=False)`` mutated to ``True`` would
    unpickle a user's file (arbitrary code); the object array must be refused by np.load itself,
    before any entry is looked at."""
    f = tmp_path / "graph.npy"
    np.save(f, np.array([[0, 1], [1, 0]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="could not read graph adjacency file.*allow_pickle"):
        gs.make_graph(f"file:{f}", 2)


# ---------------------------------------------------------------------------- induced subgraphs
def test_induced_keeps_the_edges_among_the_kept_agents_and_names_the_others():
    """graphs.py induced: ring 0-1-2-3-4-0 without 3 and 4 is the path 0-1-2, named after the
    dropped agents (mutants of ``set(range(size)) - set(keep)`` named the kept ones or failed);
    keeping every agent, agent 0 included, is valid (``min(keep) < 0`` -> ``== 0``,
    ``max(keep) >= size`` -> ``< size`` / ``is not size`` refused it)."""
    sub = gs.induced(gs.ring(5), [0, 1, 2])
    np.testing.assert_array_equal(sub.adjacency, [[0, 1, 0], [1, 0, 1], [0, 1, 0]])
    assert sub.name == "ring without [3, 4]"
    whole = gs.induced(gs.ring(4), [0, 1, 2, 3])
    np.testing.assert_array_equal(whole.adjacency, gs.ring(4).adjacency)


@pytest.mark.parametrize("keep", [[1, 4], [1, 1], [-1, 0]])
def test_induced_refuses_unknown_or_repeated_agents(keep):
    """graphs.py induced: agent 4 of a ring of 4 (``>= size`` -> ``> size``), a repeated agent
    (``or`` -> ``and``: the duplicate fell through to the disconnected-graph error)."""
    with pytest.raises(ValueError, match="are not distinct agents of a graph of 4"):
        gs.induced(gs.ring(4), keep)


def test_a_torus_larger_than_m_is_refused():
    """graphs.py make_graph: ``rows * cols != m`` -> ``<`` built a 2x3 torus for m = 5."""
    with pytest.raises(ValueError, match="a 2x3 torus has 6 agents but there are m=5"):
        gs.make_graph("torus:2x3", 5)


# ---------------------------------------------------------------------------- schedules
def test_schedule_parses_to_milestones_and_rounds():
    """mixing.py parse_schedule on the reference milestones (the docstring's example) and on a
    milestone 0 (``last = -1`` -> ``+1`` refused it; the final milestone is -1, not ``~1``)."""
    assert mixmat.parse_schedule("1:2000,2:3000,3") == ((2000, 1), (3000, 2), (-1, 3))
    assert mixmat.parse_schedule("4:0, 5") == ((0, 4), (-1, 5))
    assert mixmat.parse_schedule("7") == ((-1, 7),)


@pytest.mark.parametrize("text, message", [
    ("1:5,2:5,3", "milestones must increase"),  # ``last = t if sep`` -> ``if not sep``
    ("1:5,2:4,3", "milestones must increase"),
    ("0:5,3", "rounds must be >= 1"),
    ("1:5,3:9", "must be rounds only"),
    ("1,3", "needs a milestone"),
])
def test_bad_schedules_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        mixmat.parse_schedule(text)


def test_scheduled_rounds_follow_the_milestones():
    """mixing.py scheduled_rounds: R1 for t <= T1, R2 for T1 < t <= T2, RL after
    (``until < 0 or`` -> ``until >= 0 or`` always gave R1)."""
    sched = ((2000, 1), (3000, 2), (-1, 3))
    got = [mixmat.scheduled_rounds(sched, t) for t in (1, 2000, 2001, 3000, 3001, 10**6)]
    assert got == [1, 1, 2, 2, 3, 3]


# ---------------------------------------------------------------------------- spectral rounds
@pytest.mark.parametrize("m", [5, 8, 11])
def test_rounds_for_a_ring_is_the_closed_form(m):
    """mixing.py rounds_for (mutants of ``slem = 1 - gap`` and of ``log(tol) / log(slem)``):
    the Metropolis matrix of a ring is the circulant with 1/3 on the diagonal and both
    neighbours, eigenvalues (1 + 2 cos(2 pi k / m)) / 3, so SLEM = max over k >= 1 of their
    modulus and the rounds are ceil(log 0.01 / log SLEM): 8 for m = 5, 22 for m = 8."""
    k = np.arange(1, m)
    slem = np.max(np.abs((1 + 2 * np.cos(2 * np.pi * k / m)) / 3))
    expected = math.ceil(math.log(0.01) / math.log(slem))
    w = mixmat.metropolis_weights(gs.ring(m))
    assert mixmat.rounds_for(w, 0.01) == expected
    assert {5: 8, 8: 22}.get(m, expected) == expected
    assert mixmat.spectral_gap(w) == pytest.approx(1 - slem, abs=1e-12)


def test_the_averaging_matrix_of_257_agents_has_gap_one():
    """mixing.py _check_mixing: ``shape[0] != shape[1]`` -> ``is not`` holds only for the ints
    Python caches (up to 256): 11^T / m has eigenvalues 1 and 0, so the gap is 1."""
    m = 257
    assert mixmat.spectral_gap(np.full((m, m), 1.0 / m)) == pytest.approx(1.0, abs=1e-9)


def test_mix_refuses_a_non_square_matrix_and_a_scalar():
    """mixing.py mix: ``shape[0] != shape[1]`` -> ``<`` accepted (3, 2); ``vals.ndim < 1`` ->
    ``< 0`` let a scalar through to an IndexError."""
    with pytest.raises(ValueError, match=r"mixing matrix must be square \(m, m\), got shape"):
        mixmat.mix(np.ones((3, 2)) / 2, np.ones(3))  # (numpy's own error also says "square")
    with pytest.raises(ValueError, match="one entry per agent"):
        mixmat.mix(np.eye(2), 1.0)


# ---------------------------------------------------------------------------- routing
@pytest.mark.parametrize("graph", [gs.ring(4), gs.path(2), gs.complete(4)])
def test_padded_inbox_rows_are_the_own_then_the_senders_weights(graph):
    """routing.py padded_inboxes: row = (W_ii, W_i,s1, ..., 0 for padding) with distinct weights
    (``row[j + 1]`` -> ``row[j ^ 1]`` / ``row[j << 1]`` overwrote W_ii; ``zeros(width + 1)`` ->
    ``zeros(width ^ 1)`` is wrong for odd widths: path(2) has width 1, complete(4) width 3)."""
    adj = graph.adjacency
    m = adj.shape[0]
    neighbours = {i: np.flatnonzero(adj[i]).tolist() for i in range(m)}
    weights = np.arange(1.0, m * m + 1).reshape(m, m)  # every entry distinct
    outbox = np.arange(m, dtype=float)[:, None] * 10.0
    width = max(len(v) for v in neighbours.values())
    got = padded_inboxes(outbox, neighbours, weights)
    for i in range(m):
        inbox, senders, row = got[i]
        n = len(neighbours[i])
        assert row.shape == (width + 1,) and senders.shape == (width,)
        assert sorted(senders[:n].tolist()) == neighbours[i] and np.all(senders[n:] == -1)
        assert row[0] == weights[i, i]
        np.testing.assert_array_equal(row[1:n + 1], weights[i, senders[:n]])
        np.testing.assert_array_equal(inbox[:n, 0], 10.0 * senders[:n])
        assert np.all(row[n + 1:] == 0)
