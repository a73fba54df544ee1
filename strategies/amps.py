"""AMPSStrategy: one-shot merging of clients' mean-field posteriors as a Flower strategy (a thin
class over the generic :class:`strategies.base.BundleStrategy`). Transport only: the local fits
and the merge live in :mod:`fedbayes_flwr.algorithms.amps.bundle`, :mod:`fedbayes_flwr.inference.vb` and
:mod:`fedbayes_flwr.algorithms.amps.merge`.

Use from another Flower app::

    from fedbayes_flwr.models import make_model
    from strategies import AMPSStrategy
    model = make_model("gmm", noise_scale=0.3)
    strategy = AMPSStrategy(model, num_features=1, num_clients=10, prior_scale=2 ** 0.5)
    strategy.start(grid, num_rounds=1)
    strategy.posterior  # a fedbayes_flwr.inference.posterior.StructuredPosterior of the merge

One round: every client receives the prior, fits its local posterior and sends its natural
parameters once (``latent-feature`` first answers one query with its data moments, from which
the server sets the shared prior); the server aligns the components and merges.

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", eqs. (3) and (10)-(12).
"""

from __future__ import annotations

from fedbayes_flwr.algorithms.amps import BUNDLE, AMPSConfig
from fedbayes_flwr.algorithms.base import Setup

from .base import BundleStrategy


class AMPSStrategy(BundleStrategy):
    """AMPS (and naive merging, local-only) over Flower.

    Parameters
    ----------
    model : model
        A structured model (``gmm``, ``lda``, ``latent-feature``) or ``gaussian-mean``,
        ``linear-regression``, ``logistic-regression``
        (:func:`fedbayes_flwr.models.make_model`).
    num_features : int
        Columns of the clients' data (``lda``: the vocabulary size).
    num_clients : int
        Number of partitions; nodes are matched to partitions by ``partition-id``.
    prior_scale : float
        Prior standard deviation of the means / parameters.
    run_seed : int
        Seed of the run (the clients' restarts).
    config : AMPSConfig
        The ``amps`` section (``components``, ``search``, ``restarts``, ...).
    **kwargs
        ``eval_every``, ``max_seconds``, ``max_retries`` (see :class:`BundleStrategy`).
    """

    def __init__(self, model, num_features: int, num_clients: int, prior_scale: float = 1.0,
                 run_seed: int = 0, config: AMPSConfig | None = None, **kwargs):
        config = config or AMPSConfig()
        prior = model.prior(num_features, prior_scale, BUNDLE.prior_diag(config, model))
        setup = Setup(model, prior, num_clients, num_features, run_seed, config)
        super().__init__(BUNDLE, setup, **kwargs)
