"""Distributed Stein variational gradient descent (DSVGD, U-DSVGD, P-DSVGD): the bundle and SVGD itself.

The public names are re-exported here: ``from fedbayes_flwr.algorithms.dsvgd import DSVGDConfig``.
"""

from fedbayes_flwr.algorithms.dsvgd.bundle import BUNDLE, DSVGDConfig, registrations

__all__ = ["BUNDLE", "DSVGDConfig", "registrations"]
