"""Communication graphs and Metropolis-Hastings mixing (fedbayes_flwr.algorithms.decentralized.graphs).

Property tests over many seeded random graphs: every mixing matrix is symmetric, doubly
stochastic, nonnegative, one-hop, with a positive spectral gap, and gossip converges to the
average at the rate the gap gives. Invalid graphs are rejected with messages that say why.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedbayes_flwr.algorithms.decentralized import graphs as gs
from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
from fedbayes_flwr.algorithms.decentralized.routing import route, validate_neighbours


def random_connected_graphs():
    """Many valid graphs: every constructor, several sizes and seeds (ER draws kept if connected)."""
    graphs = []
    for m in (1, 2, 3, 4, 5, 7, 10, 16):
        graphs += [gs.ring(m), gs.path(m), gs.complete(m)]
    for rows, cols in [(1, 1), (1, 2), (1, 5), (2, 2), (2, 3), (3, 3), (3, 4), (4, 5)]:
        graphs.append(gs.torus(rows, cols))
    for m in (2, 5, 9, 14, 20):
        for p in (0.2, 0.4, 0.7):
            for seed in range(6):
                try:
                    graphs.append(gs.erdos_renyi(m, p, seed))
                except ValueError:
                    pass
    # user graphs: a random spanning tree plus random extra edges
    rng = np.random.default_rng(123)
    for _ in range(30):
        m = int(rng.integers(2, 15))
        adj = np.zeros((m, m), dtype=int)
        order = rng.permutation(m)
        for k in range(1, m):
            i, j = order[k], order[int(rng.integers(0, k))]
            adj[i, j] = adj[j, i] = 1
        extra = np.triu(rng.random((m, m)) < 0.15, k=1)
        adj |= extra | extra.T
        graphs.append(gs.from_adjacency(adj))
    return graphs


GRAPHS = random_connected_graphs()


def test_many_graphs_generated():
    names = {g.name.split(":")[0] for g in GRAPHS}
    assert {"ring", "path", "complete", "torus", "erdos-renyi", "adjacency"} <= names
    assert sum(g.name.startswith("erdos-renyi") for g in GRAPHS) >= 30
    assert len(GRAPHS) > 100


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: f"{g.name}-m{g.size}")
def test_metropolis_matrix_properties(graph):
    adj = graph.adjacency
    m = graph.size
    w = mixmat.metropolis_weights(graph)
    assert w.shape == (m, m) and w.dtype == np.float64
    np.testing.assert_array_equal(w, w.T)  # exactly symmetric
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    assert np.all(w >= 0.0)
    off_graph = ~adj & ~np.eye(m, dtype=bool)
    assert np.all(w[off_graph] == 0.0)  # one-hop
    # the formula, entry by entry
    deg = adj.sum(axis=1)
    for i in range(m):
        for j in range(m):
            if adj[i, j]:
                assert w[i, j] == pytest.approx(1.0 / (1 + max(deg[i], deg[j])), rel=1e-15)
        assert w[i, i] >= 1.0 / (1 + deg[i]) - 1e-15
    # same matrix from the raw adjacency
    np.testing.assert_array_equal(mixmat.metropolis_weights(adj), w)
    gap = mixmat.spectral_gap(w)
    assert 0.0 < gap <= 1.0 + 1e-12
    # gap against a dense eigen-decomposition of W - 11^T / m (SLEM = its spectral norm)
    slem = np.linalg.norm(w - np.full((m, m), 1.0 / m), 2) if m > 1 else 0.0
    assert gap == pytest.approx(1.0 - slem, abs=1e-10)


@pytest.mark.parametrize("graph", GRAPHS[::3], ids=lambda g: f"{g.name}-m{g.size}")
def test_graph_structure_and_routing(graph):
    adj = graph.adjacency
    assert adj.dtype == np.bool_ and not adj.flags.writeable
    assert gs.is_connected(adj)
    nbrs = graph.neighbours
    validate_neighbours(nbrs)
    assert sorted(nbrs) == list(range(graph.size))
    for i, js in nbrs.items():
        assert list(js) == sorted(js) and all(type(j) is int for j in js)
        assert set(js) == set(np.flatnonzero(adj[i]).tolist())
    np.testing.assert_array_equal(graph.degrees, [len(nbrs[i]) for i in range(graph.size)])
    inbox = route({i: f"msg{i}" for i in range(graph.size)}, nbrs)
    assert all(list(inbox[i]) == list(nbrs[i]) for i in nbrs)


@pytest.mark.parametrize("graph", [gs.ring(9), gs.path(6), gs.torus(3, 4), gs.erdos_renyi(12, 0.3, 1),
                                   gs.complete(5), gs.torus(2, 2)],
                         ids=lambda g: f"{g.name}-m{g.size}")
def test_mix_converges_to_average_at_gap_rate(graph):
    m = graph.size
    w = mixmat.metropolis_weights(graph)
    rate = 1.0 - mixmat.spectral_gap(w)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(m, 3, 2))
    avg = x.mean(axis=0)
    err0 = np.linalg.norm(x - avg)
    for k in (1, 2, 5, 10, 40):
        y = mixmat.mix(w, x, rounds=k)
        assert y.shape == x.shape
        np.testing.assert_allclose(y.mean(axis=0), avg, atol=1e-12)  # average preserved
        err = np.linalg.norm(y - avg)
        assert err <= rate**k * err0 * (1 + 1e-9) + 1e-12
    # rate is tight: the slowest eigenvector decays exactly at rate^k
    eig, vec = np.linalg.eigh(w)
    slow = vec[:, np.argmin(np.abs(np.abs(eig) - rate))] if m > 1 else None
    if slow is not None and rate > 1e-8:
        z = mixmat.mix(w, slow, rounds=7)
        assert np.linalg.norm(z) == pytest.approx(rate**7, rel=1e-8)
    # mix(rounds=k) is k single rounds
    step = x
    for _ in range(5):
        step = mixmat.mix(w, step)
    np.testing.assert_allclose(step, mixmat.mix(w, x, rounds=5), atol=1e-12)


def test_mix_edge_cases():
    w = mixmat.metropolis_weights(gs.ring(4))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(mixmat.mix(w, x, rounds=0), x)
    assert mixmat.mix(w, x, rounds=3).dtype == np.float32
    assert mixmat.mix(w, np.arange(4), rounds=1).dtype == np.float64
    np.testing.assert_allclose(mixmat.mix(w, [1.0, 1.0, 1.0, 1.0], rounds=3), 1.0)
    with pytest.raises(ValueError, match="one entry per agent"):
        mixmat.mix(w, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="rounds must be at least 0"):
        mixmat.mix(w, x, rounds=-1)
    with pytest.raises(ValueError, match="square"):
        mixmat.mix(np.ones((2, 3)), x)


def test_spectral_gap_known_values_and_checks():
    # complete graph K_m: W = 11^T / m, gap 1
    assert mixmat.spectral_gap(mixmat.metropolis_weights(gs.complete(6))) == pytest.approx(1.0)
    # ring of m >= 3: W = (I + A) / 3, eigenvalues (1 + 2 cos(2 pi k / m)) / 3
    for m in (3, 4, 5, 8, 11):
        lam = (1 + 2 * np.cos(2 * np.pi * np.arange(1, m) / m)) / 3
        gap = mixmat.spectral_gap(mixmat.metropolis_weights(gs.ring(m)))
        assert gap == pytest.approx(1 - np.max(np.abs(lam)), abs=1e-12)
    assert mixmat.spectral_gap([[1.0]]) == 1.0
    # disconnected block-diagonal stochastic matrix: eigenvalue 1 twice, gap 0
    block = np.kron(np.eye(2), np.full((2, 2), 0.5))
    assert mixmat.spectral_gap(block) == pytest.approx(0.0, abs=1e-12)
    # bipartite without self-weight: eigenvalue -1, gap 0
    assert mixmat.spectral_gap([[0.0, 1.0], [1.0, 0.0]]) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="symmetric"):
        mixmat.spectral_gap([[0.5, 0.5], [0.2, 0.8]])
    with pytest.raises(ValueError, match="sum to 1"):
        mixmat.spectral_gap([[0.5, 0.4], [0.4, 0.5]])
    with pytest.raises(ValueError, match="square"):
        mixmat.spectral_gap(np.ones((2, 3)) / 3)


def test_ring_path_torus_complete_degrees():
    for m in (3, 4, 10):
        g = gs.ring(m)
        assert g.name == "ring" and np.all(g.degrees == 2) and g.adjacency.sum() == 2 * m
        assert g.neighbours[0] == (1, m - 1)
    for m in (1, 2):
        assert gs.ring(m).name == "path"
        np.testing.assert_array_equal(gs.ring(m).adjacency, gs.path(m).adjacency)
    for m in (2, 3, 7):
        g = gs.path(m)
        assert g.degrees.tolist() == [1] + [2] * (m - 2) + [1]
        assert g.adjacency.sum() == 2 * (m - 1)
    assert gs.path(1).degrees.tolist() == [0]
    assert gs.complete(5).degrees.tolist() == [4] * 5
    assert gs.complete(1).size == 1
    # torus: degree 4 for sides >= 3; a side of 2 adds one neighbour, a side of 1 none
    expected = {(3, 3): 4, (3, 5): 4, (2, 3): 3, (3, 2): 3, (2, 2): 2, (1, 4): 2, (4, 1): 2,
                (1, 2): 1, (2, 1): 1, (1, 1): 0}
    for (rows, cols), deg in expected.items():
        g = gs.torus(rows, cols)
        assert g.name == f"torus:{rows}x{cols}" and g.size == rows * cols
        assert np.all(g.degrees == deg), (rows, cols, g.degrees)
        assert not np.any(np.diagonal(g.adjacency))
    # agent r * cols + c; neighbours of (1, 1) in a 3x4 torus
    assert gs.torus(3, 4).neighbours[5] == (1, 4, 6, 9)
    np.testing.assert_array_equal(gs.torus(1, 6).adjacency, gs.ring(6).adjacency)
    perm = [0, 1, 3, 2]  # the 2x2 torus is the 4-cycle 0 - 1 - 3 - 2 - 0
    np.testing.assert_array_equal(gs.torus(2, 2).adjacency[np.ix_(perm, perm)], gs.ring(4).adjacency)


def test_erdos_renyi_reproducible_and_extremes():
    a = gs.erdos_renyi(12, 0.4, seed=3)
    b = gs.erdos_renyi(12, 0.4, seed=3)
    np.testing.assert_array_equal(a.adjacency, b.adjacency)
    assert a.name == "erdos-renyi:0.4"
    np.testing.assert_array_equal(gs.erdos_renyi(7, 1.0, 0).adjacency, gs.complete(7).adjacency)
    assert gs.erdos_renyi(1, 0.0, 0).size == 1
    # edge frequency close to p over a larger graph
    g = gs.erdos_renyi(60, 0.3, seed=0)
    assert g.adjacency.sum() / (60 * 59) == pytest.approx(0.3, abs=0.03)


def test_disconnected_erdos_renyi_rejected_with_message():
    with pytest.raises(ValueError, match=r"m=10, p=0\.05, seed=7 is disconnected") as info:
        gs.erdos_renyi(10, 0.05, seed=7)
    msg = str(info.value)
    assert "connected components" in msg and "larger p" in msg
    with pytest.raises(ValueError, match="disconnected"):
        gs.erdos_renyi(5, 0.0, seed=0)
    # every seed at a tiny p on a large graph is rejected, none silently
    for seed in range(5):
        with pytest.raises(ValueError, match=f"seed={seed} is disconnected"):
            gs.erdos_renyi(30, 0.02, seed)
    for bad in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="probability p"):
            gs.erdos_renyi(5, bad, 0)
    with pytest.raises(ValueError, match="seed must be an integer"):
        gs.erdos_renyi(5, 0.5, 1.5)


@pytest.mark.parametrize("matrix, message", [
    (np.zeros((2, 3)), r"square \(m, m\) matrix, got shape \(2, 3\)"),
    (np.zeros(4), r"square \(m, m\) matrix, got shape \(4,\)"),
    (np.zeros((0, 0)), "at least one agent"),
    ([[0, 1], [1]], "square matrix"),
    ([[0, 1, 0], [1, 0, 1], [1, 1, 0]], r"symmetric.*entry \[0, 2\] is 0 but \[2, 0\] is 1"),
    ([[1, 1], [1, 0]], r"zero diagonal \(no self-loops\); agents \[0\]"),
    ([[0, 2], [2, 0]], r"binary \(0/1\); entry \[0, 1\] is"),
    ([[0, 0.5], [0.5, 0]], "binary"),
    ([[0, np.nan], [np.nan, 0]], "binary"),
    ([[0, -1], [-1, 0]], "binary"),
    ([["0", "1"], ["1", "0"]], "0/1 numbers or booleans"),
    (np.zeros((3, 3)), r"connected, but it has 3 connected components"),
    (np.kron(np.eye(2), 1 - np.eye(3)).astype(int), r"2 connected components \(agents \[3, 4, 5\]"),
])
def test_bad_adjacency_rejected(matrix, message):
    with pytest.raises(ValueError, match=message):
        gs.from_adjacency(matrix)
    with pytest.raises(ValueError, match=message):
        mixmat.metropolis_weights(matrix)


def test_random_bad_adjacencies_rejected():
    rng = np.random.default_rng(5)
    for _ in range(40):
        adj = gs.make_graph(str(rng.choice(["ring", "torus", "complete", "er:0.7"])), 8,
                            seed=int(rng.integers(0, 3))).adjacency.astype(int)
        i, j = rng.choice(8, size=2, replace=False)
        asym = adj.copy()
        asym[i, j] = 1 - asym[i, j]
        with pytest.raises(ValueError, match="symmetric"):
            gs.from_adjacency(asym)
        loop = adj.copy()
        loop[i, i] = 1
        with pytest.raises(ValueError, match="self-loops"):
            gs.from_adjacency(loop)
        cut = adj.copy()
        cut[i, :] = cut[:, i] = 0  # isolate agent i
        with pytest.raises(ValueError, match="connected components"):
            gs.from_adjacency(cut)
        assert not gs.is_connected(cut)


def test_from_adjacency_accepts_bool_int_float_and_copies():
    src = np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]])
    for mat in (src, src.astype(bool), src.astype(float), src.tolist()):
        g = gs.from_adjacency(mat)
        assert g.name == "adjacency" and g.adjacency.dtype == np.bool_
        assert g.neighbours == {0: (1, 2), 1: (0,), 2: (0,)}
    src[0, 1] = 0
    assert g.adjacency[0, 1]  # the graph holds its own copy
    assert gs.from_adjacency([[0]]).size == 1


def test_is_connected():
    assert gs.is_connected([[0, 1], [1, 0]])
    assert gs.is_connected([[0]])
    assert not gs.is_connected([[0, 0], [0, 0]])
    assert not gs.is_connected(np.zeros((0, 0)))
    assert gs.is_connected([[0, 1], [0, 0]])  # directions ignored
    with pytest.raises(ValueError, match="square"):
        gs.is_connected(np.zeros((2, 3)))


def test_make_graph_keys(tmp_path):
    assert gs.make_graph("ring", 5).name == "ring"
    assert gs.make_graph(" Ring ", 5).name == "ring"
    assert gs.make_graph("path", 4).name == "path"
    assert gs.make_graph("complete", 4).degrees.tolist() == [3] * 4
    assert gs.make_graph("torus", 12).name == "torus:3x4"
    assert gs.make_graph("torus", 16).name == "torus:4x4"
    assert gs.make_graph("torus", 7).name == "torus:1x7"
    assert gs.make_graph("torus:2x3", 6).name == "torus:2x3"
    assert gs.make_graph("TORUS: 3 x 2", 6).name == "torus:3x2"
    for key in ("erdos-renyi:0.5", "erdos_renyi:0.5", "er:0.5"):
        g = gs.make_graph(key, 10, seed=4)
        np.testing.assert_array_equal(g.adjacency, gs.erdos_renyi(10, 0.5, 4).adjacency)
    lit = [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    np.testing.assert_array_equal(gs.make_graph(json.dumps(lit), 3).adjacency, np.array(lit, bool))
    np.testing.assert_array_equal(gs.make_graph("[[0,1],[1,0]]", 2).adjacency, ~np.eye(2, dtype=bool))
    npy = tmp_path / "A.npy"
    np.save(npy, np.array(lit))
    js = tmp_path / "A.json"
    js.write_text(json.dumps(lit))
    csv = tmp_path / "A.csv"
    csv.write_text("0,1,0\n1,0,1\n0,1,0\n")
    txt = tmp_path / "A.txt"
    txt.write_text("0 1 0\n1 0 1\n0 1 0\n")
    for f in (npy, js, csv, txt):
        g = gs.make_graph(f"file:{f}", 3)
        assert g.neighbours == {0: (1,), 1: (0, 2), 2: (1,)}


def test_make_graph_errors(tmp_path):
    cases = [
        ("star", 4, "unknown graph spec 'star'"),
        ("", 4, "unknown graph spec"),
        ("ring:3", 4, "takes no parameter"),
        ("torus:2x2", 6, "2x2 torus has 4 agents but there are m=6"),
        ("torus:2by3", 6, r"torus:RxC"),
        ("torus:2x", 6, r"torus:RxC"),
        ("erdos-renyi", 6, "needs an edge probability"),
        ("erdos-renyi:abc", 6, "'abc' is not a number"),
        ("erdos-renyi:1.5", 6, "probability p"),
        ("erdos-renyi:0.0", 6, "disconnected"),
        ("[[0,1],[1,0]", 2, "not a valid JSON adjacency literal"),
        ("[[0,1],[1,0]]", 3, "adjacency for 2 agents but there are m=3"),
        ("[[0,1],[0,0]]", 2, "symmetric"),
        ("file:", 2, "needs a path"),
        (f"file:{tmp_path / 'missing.npy'}", 2, "does not exist"),
        ("ring", 0, "number of agents m must be at least 1"),
    ]
    for spec, m, message in cases:
        with pytest.raises(ValueError, match=message):
            gs.make_graph(spec, m, seed=0)
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1\n1,zero\n")
    with pytest.raises(ValueError, match="could not read graph adjacency file"):
        gs.make_graph(f"file:{bad}", 2)
    with pytest.raises(ValueError, match="must be a string"):
        gs.make_graph(None, 2)


def test_constructor_size_errors():
    for fn in (gs.ring, gs.path, gs.complete):
        for bad in (0, -1, 2.0, True, "3"):
            with pytest.raises(ValueError, match="size m"):
                fn(bad)
    with pytest.raises(ValueError, match="torus rows must be at least 1"):
        gs.torus(0, 3)
    with pytest.raises(ValueError, match="torus cols must be an integer"):
        gs.torus(3, 1.5)


def test_documented_hint_threshold():
    # the ER error suggests p around 2 log(m) / m; at that p a connected draw is typical
    m = 20
    p = 2 * math.log(m) / m
    connected = sum(gs.is_connected(_er_adj(m, p, s)) for s in range(20))
    assert connected >= 15


def _er_adj(m, p, seed):
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((m, m)) < p, k=1)
    return upper | upper.T
