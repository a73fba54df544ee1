"""DSVGDStrategy: distributed Stein variational gradient descent as a Flower strategy (a thin
class over the generic :class:`strategies.base.BundleStrategy`). Transport only: every update
rule lives in :mod:`fedbayes_flwr.algorithms.dsvgd.bundle`.

Use from another Flower app::

    from strategies import DSVGDStrategy
    strategy = DSVGDStrategy(prior, model, num_clients=10, run_seed=0)
    strategy.start(grid, num_rounds=20)
    strategy.posterior  # a fedbayes_flwr.inference.posterior.SamplePosterior of the global particles

Each round the server sends its ``N x d`` particles to the scheduled client(s) and takes back
their new global particles; clients keep their factor (distilled local particles, or U-DSVGD's
particle history) in ``context.state`` as pending until the next request acknowledges it.

References
----------
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein
Variational Gradient Descent", Algorithms 1-2.
"""

from __future__ import annotations

from fedbayes_flwr.algorithms.base import Setup
from fedbayes_flwr.algorithms.dsvgd import BUNDLE, DSVGDConfig
from fedbayes_flwr.inference.gaussian import NaturalGaussian

from .base import BundleStrategy


class DSVGDStrategy(BundleStrategy):
    """DSVGD over Flower.

    Parameters
    ----------
    prior : NaturalGaussian
        The prior's Gaussian (the initial particles are drawn from it; a model with its own
        non-Gaussian prior uses that prior's score and this only for the initial draw).
    model : fedbayes_flwr.models.Model
        The model (the particle number and step size defaults depend on it).
    num_clients : int
        Number of partitions; nodes are matched to partitions by ``partition-id``.
    run_seed : int
        Seed of the run (initial particles, schedule, mini-batches).
    config : DSVGDConfig
        The ``dsvgd`` section.
    **kwargs
        ``eval_every``, ``max_seconds``, ``max_retries`` (see :class:`BundleStrategy`).
    """

    def __init__(self, prior: NaturalGaussian, model, num_clients: int, run_seed: int = 0,
                 config: DSVGDConfig | None = None, **kwargs):
        setup = Setup(model, prior, num_clients, prior.dim, run_seed, config or DSVGDConfig())
        super().__init__(BUNDLE, setup, **kwargs)
