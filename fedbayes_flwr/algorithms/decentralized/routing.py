"""Routing for decentralized bundles: who receives whose message in one gossip exchange.

Flower is a star; a decentralized algorithm's ``requests`` builds each agent's request from the
messages of its graph neighbours with :func:`route`, so the in-process engine and the Flower
strategy (which only carries what ``requests`` returns) route identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def validate_neighbours(neighbours: Mapping[int, Sequence[int]]) -> None:
    """Raise ``ValueError`` unless the graph is symmetric, loop-free and uses known agents."""
    agents = set(neighbours)
    for agent, nbrs in neighbours.items():
        for other in nbrs:
            if other == agent:
                raise ValueError(f"agent {agent} lists itself as a neighbour (self-loop)")
            if other not in agents:
                raise ValueError(f"agent {agent} lists unknown neighbour {other}")
            if agent not in neighbours[other]:
                raise ValueError(f"graph is not symmetric: {agent} -> {other} but not back")


def route(outbox: Mapping[int, object], neighbours: Mapping[int, Sequence[int]]
          ) -> dict[int, dict[int, object]]:
    """Each agent's inbox: ``{agent: {sender: message}}`` over its neighbours, in sender order.

    ``outbox`` holds the message each agent broadcasts; an agent whose neighbour sent nothing
    (failed, or absent from ``outbox``) simply receives fewer messages.
    """
    return {agent: {s: outbox[s] for s in sorted(nbrs) if s in outbox}
            for agent, nbrs in sorted(neighbours.items())}


def padded_inboxes(outbox: np.ndarray, neighbours: Mapping[int, Sequence[int]],
                   weights: np.ndarray, width: int | None = None
                   ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each agent's ``(inbox, senders, row weights)`` with fixed shapes (Flower's templates).

    ``inbox (width, ...)`` stacks the neighbours' broadcasts from ``outbox (m, ...)``, padded
    with zeros to ``width`` (default: the largest degree; a graph that lost agents keeps the
    full graph's width, the templates' shape); ``senders (width,)`` names them (``-1`` for
    padding); ``row weights (width + 1,)`` are ``(W_ii, W_i,senders...)`` (0 for padding).
    Only the agents that are keys of ``neighbours`` get an inbox.
    """
    width = width or max(1, max((len(v) for v in neighbours.values()), default=0))
    out = {}
    for agent, nbrs in sorted(neighbours.items()):  # one fancy-indexed copy per agent
        got = [s for s in sorted(nbrs) if 0 <= s < len(outbox)]
        senders = np.full(width, -1, np.int64)
        senders[:len(got)] = got
        inbox = np.zeros((width, *outbox.shape[1:]))
        inbox[:len(got)] = outbox[got]
        row = np.zeros(width + 1)
        row[0] = weights[agent, agent]
        row[1:len(got) + 1] = weights[agent, got]
        out[agent] = (inbox, senders, row)
    return out
