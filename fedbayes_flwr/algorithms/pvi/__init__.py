"""Partitioned variational inference (PVI) and its baselines: config, messages, client and server steps,
the server's step search, presets.

The public names are re-exported here: ``from fedbayes_flwr.algorithms.pvi import PVIConfig``.
"""

from fedbayes_flwr.algorithms.pvi.bundle import BUNDLE, PVIConfig, registrations

__all__ = ["BUNDLE", "PVIConfig", "registrations"]
