"""PVIStrategy: partitioned variational inference as a Flower strategy (a thin class over the
generic :class:`strategies.base.BundleStrategy`). Transport only: every update rule lives in
:mod:`fedbayes_flwr.algorithms.pvi.bundle`.

Use from another Flower app::

    from strategies import PVIStrategy
    strategy = PVIStrategy(prior, num_clients=10, run_seed=0)
    strategy.start(grid, num_rounds=10)
    strategy.posterior  # a fedbayes_flwr.inference.posterior.GaussianPosterior

The schedule (``PVIConfig.schedule``) picks the driver: synchronous and sequential PVI run in
barrier exchanges (train, then the free-energy query at evaluation points); asynchronous PVI
applies each reply as it is pulled. ``AsyncPVIStrategy`` is the same class with the asynchronous
schedule as its default.

References
----------
Ashman et al. (2022), "Partitioned Variational Inference", Algorithm 1 and Section 2.4.
"""

from __future__ import annotations

import dataclasses

from fedbayes_flwr.algorithms.base import Setup
from fedbayes_flwr.algorithms.pvi import BUNDLE, PVIConfig
from fedbayes_flwr.inference.gaussian import NaturalGaussian

from .base import BundleStrategy


class PVIStrategy(BundleStrategy):
    """PVI over Flower.

    Parameters
    ----------
    prior : NaturalGaussian
        The prior; its structure (full or diagonal) fixes every message's shape.
    num_clients : int
        Number of partitions ``M``; nodes are matched to partitions by ``partition-id``.
    run_seed : int
        Seed of the run; per-client seeds derive from it, the update and the partition id.
    config : PVIConfig
        The ``pvi`` section (damping, schedule, local optimiser).
    model : fedbayes_flwr.models.Model, optional
        Tells the server whether the model's expectations are Monte Carlo (BNNs), which sets
        what ``step-rule = auto`` and ``proximal = auto`` mean; without one the server uses the
        settings of models with exact expectations (right for conjugate and logistic models).
    **kwargs
        ``eval_every``, ``max_seconds``, ``max_retries`` (see :class:`BundleStrategy`).
    """

    default_schedule: str | None = None

    def __init__(self, prior: NaturalGaussian, num_clients: int, run_seed: int = 0,
                 config: PVIConfig | None = None, model=None, **kwargs):
        config = config or PVIConfig()
        if self.default_schedule is not None and config == PVIConfig():
            config = dataclasses.replace(config, schedule=self.default_schedule)
        setup = Setup(model, prior, num_clients, prior.dim, run_seed, config)
        super().__init__(BUNDLE, setup, **kwargs)


class AsyncPVIStrategy(PVIStrategy):
    """Asynchronous PVI (``schedule='asynchronous'`` unless a config says otherwise)."""

    default_schedule = "asynchronous"
