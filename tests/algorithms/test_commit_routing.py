"""Shared pieces for bundles: commit on acknowledgement, and gossip routing."""

import numpy as np
import pytest

from fedbayes_flwr.algorithms import commit
from fedbayes_flwr.algorithms.decentralized.routing import route, validate_neighbours


def test_pending_value_commits_only_when_acknowledged():
    state = commit.propose(commit.init("old"), "new", request_round=4)
    assert state.value == "old" and state.pending == "new"
    assert commit.acknowledge(state, accepted_round=4) == commit.init("new")
    assert commit.acknowledge(state, accepted_round=3) == commit.init("old")  # rejected: dropped
    assert commit.acknowledge(commit.init("x"), 7) == commit.init("x")  # nothing pending
    accepted = np.full(3, commit.NO_ROUND)
    after = commit.record_accepted(accepted, 1, 4)
    assert list(after) == [-1, 4, -1] and list(accepted) == [-1, -1, -1]  # pure


def test_each_agent_receives_exactly_its_neighbours_messages():
    ring = {0: [1, 3], 1: [0, 2], 2: [1, 3], 3: [2, 0]}
    validate_neighbours(ring)
    inbox = route({a: f"m{a}" for a in ring}, ring)
    assert inbox == {0: {1: "m1", 3: "m3"}, 1: {0: "m0", 2: "m2"}, 2: {1: "m1", 3: "m3"},
                     3: {0: "m0", 2: "m2"}}
    assert route({0: "m0"}, ring)[1] == {0: "m0"}  # a silent neighbour sends nothing


@pytest.mark.parametrize("graph, match", [({0: [0]}, "self-loop"), ({0: [1], 1: []}, "symmetric"),
                                          ({0: [5]}, "unknown")])
def test_bad_graphs_are_rejected(graph, match):
    with pytest.raises(ValueError, match=match):
        validate_neighbours(graph)
