"""AMPS: one-shot merging of exponential-family posteriors with permutation matching, and the streaming
schemes over it.

The public names are re-exported here: ``from fedbayes_flwr.algorithms.amps import AMPSConfig``.
"""

from fedbayes_flwr.algorithms.amps.bundle import BUNDLE, AMPSConfig, registrations

__all__ = ["BUNDLE", "AMPSConfig", "registrations"]
