"""GossipRouter: turning Flower's star into a peer graph for any decentralized bundle.

The server never aggregates: for each exchange it gives every agent exactly its graph
neighbours' last broadcasts (padded to the largest degree, sender id ``-1`` for padding) and its
row of the mixing matrix. Decentralized bundles build their requests with the same library
function (:func:`fedbayes_flwr.algorithms.decentralized.routing.padded_inboxes`), so the in-process engine and
Flower route identically; this class is the entry point for Flower apps that route their own
messages.

References
----------
Xiao & Boyd (2004), "Fast linear iterations for distributed averaging" (Metropolis-Hastings
mixing weights).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.algorithms.decentralized.graphs import Graph, make_graph
from fedbayes_flwr.algorithms.decentralized.mixing import metropolis_weights
from fedbayes_flwr.algorithms.decentralized.routing import padded_inboxes


class GossipRouter:
    """Route agents' broadcasts over ``graph`` (a
    :class:`fedbayes_flwr.algorithms.decentralized.graphs.Graph` or a
    :func:`fedbayes_flwr.algorithms.decentralized.graphs.make_graph` spec with ``num_agents`` and
    ``seed``)."""

    def __init__(self, graph: Graph | str, num_agents: int | None = None, seed: int = 0):
        if isinstance(graph, str):
            if num_agents is None:
                raise ValueError("a graph spec needs num_agents")
            graph = make_graph(graph, num_agents, seed)
        self.graph = graph
        self.weights = metropolis_weights(graph)

    def route(self, outbox: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``{agent: (inbox, senders, weights)}`` for the agents' broadcasts ``outbox (m, ...)``."""
        return padded_inboxes(outbox, self.graph.neighbours, self.weights)
