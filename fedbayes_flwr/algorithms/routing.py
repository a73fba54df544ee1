"""Routing for decentralized bundles: who receives whose message in one gossip exchange.

Flower is a star; a decentralized algorithm's ``requests`` builds each agent's request from the
messages of its graph neighbours with :func:`route`, so the in-process engine and the Flower
strategy (which only carries what ``requests`` returns) route identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
