"""DecentralizedHMCStrategy: decentralized Metropolis-adjusted HMC over a peer graph, as a Flower
strategy (a thin class over :class:`strategies.base.BundleStrategy`). Flower's star carries the
gossip: each request holds an agent exactly its graph neighbours' last messages
(:class:`strategies.gossip.GossipRouter`); the maths is in :mod:`fedbayes_flwr.algorithms.dhmc.agents` and the
protocol in :mod:`fedbayes_flwr.algorithms.dhmc.bundle`.

Use from another Flower app::

    from fedbayes_flwr.algorithms.dhmc import DHMCConfig
    from fedbayes_flwr.models import make_model
    from strategies import DecentralizedHMCStrategy
    model = make_model("logistic-regression")
    prior = model.prior(num_features=5, prior_scale=1.0, diag=True)
    strategy = DecentralizedHMCStrategy(prior, model, num_clients=5,
                                        config=DHMCConfig(graph="ring", iterations=500))
    strategy.start(grid, num_rounds=700)  # warm-up + iterations
    strategy.posterior  # a TracePosterior: agents' average per chain, every agent's iterates

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1.
"""

from __future__ import annotations

from fedbayes_flwr.algorithms.base import Setup
from fedbayes_flwr.algorithms.dhmc import BUNDLE, DHMCConfig
from fedbayes_flwr.inference.gaussian import NaturalGaussian

from .base import BundleStrategy


class DecentralizedHMCStrategy(BundleStrategy):
    """Decentralized MH-HMC over Flower.

    Parameters
    ----------
    prior : NaturalGaussian
        The prior (split evenly over the agents' potentials).
    model : fedbayes_flwr.models.Model
        A model with a numpy potential (``bounded_potential``).
    num_clients : int
        Number of agents (partitions; nodes are matched by ``partition-id``).
    run_seed : int
        Seed of the run (initial positions, shared momentum and uniforms, random graphs).
    config : DHMCConfig
        The ``dhmc`` section (graph, step size, warm-up, mixing rounds, chains, ...).
    **kwargs
        ``eval_every``, ``max_seconds``, ``max_retries`` (see :class:`BundleStrategy`).
    """

    def __init__(self, prior: NaturalGaussian, model, num_clients: int, run_seed: int = 0,
                 config: DHMCConfig | None = None, **kwargs):
        setup = Setup(model, prior, num_clients, prior.dim, run_seed, config or DHMCConfig())
        super().__init__(BUNDLE, setup, **kwargs)
