"""Fed-PDMC: federated Zig-Zag and bouncy particle samplers: the bundle, the event-time sampler, the
transport-free driver and the privacy bound.

The public names are re-exported here: ``from fedbayes_flwr.algorithms.pdmc import PDMCConfig``.
"""

from fedbayes_flwr.algorithms.pdmc.bundle import BUNDLE, PDMCConfig, registrations

__all__ = ["BUNDLE", "PDMCConfig", "registrations"]
