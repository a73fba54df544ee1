"""Decentralized Metropolis-adjusted HMC with gradient tracking: the bundle, the agents' maths, the
vectorised loop and the baselines.

The public names are re-exported here: ``from fedbayes_flwr.algorithms.dhmc import DHMCConfig``.
"""

from fedbayes_flwr.algorithms.dhmc.bundle import BUNDLE, DHMCConfig, registrations

__all__ = ["BUNDLE", "DHMCConfig", "registrations"]
