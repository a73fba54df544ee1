"""PDMCStrategy: federated Zig-Zag / bouncy particle samplers as a Flower strategy (a thin class
over the generic :class:`strategies.base.BundleStrategy`). Transport only: the samplers live in
:mod:`fedbayes_flwr.algorithms.pdmc.sampler` and the protocol in
:mod:`fedbayes_flwr.algorithms.pdmc.bundle`.

Use from another Flower app::

    from fedbayes_flwr.algorithms.pdmc import PDMCConfig
    from fedbayes_flwr.models import make_model
    from strategies import PDMCStrategy
    model = make_model("logistic-regression")
    prior = model.prior(num_features=5, prior_scale=1.0, diag=True)
    strategy = PDMCStrategy(prior, model, num_clients=4, config=PDMCConfig(process_time=20.0))
    strategy.start(grid, num_rounds=10**9)  # the stopping rule ends the run
    strategy.posterior  # a TracePosterior: samples with the chains kept apart, the skeleton

Every exchange carries the K chains' positions, velocities and the horizon to every worker and
brings back each worker's proposed event times (``+inf`` for none before the horizon) and
velocities; the server applies the earliest per chain.

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Algorithm 2.
"""

from __future__ import annotations

from fedbayes_flwr.algorithms.base import Setup
from fedbayes_flwr.algorithms.pdmc import BUNDLE, PDMCConfig
from fedbayes_flwr.inference.gaussian import NaturalGaussian

from .base import BundleStrategy


class PDMCStrategy(BundleStrategy):
    """Fed-PDMC over Flower.

    Parameters
    ----------
    prior : NaturalGaussian
        The prior (``U_0``, held by the server; ``config.flat_prior`` ignores it).
    model : fedbayes_flwr.models.Model
        A model with ``bounded_potential`` (gaussian-mean, logistic-regression, ar1-student-t).
    num_clients : int
        Number of workers (partitions; nodes are matched by ``partition-id``).
    run_seed : int
        Seed of the run (initial states, every worker's stream).
    config : PDMCConfig
        The ``pdmc`` section.
    **kwargs
        ``eval_every``, ``max_seconds``, ``max_retries`` (see :class:`BundleStrategy`).
    """

    def __init__(self, prior: NaturalGaussian, model, num_clients: int, run_seed: int = 0,
                 config: PDMCConfig | None = None, **kwargs):
        setup = Setup(model, prior, num_clients, prior.dim, run_seed, config or PDMCConfig())
        super().__init__(BUNDLE, setup, **kwargs)
