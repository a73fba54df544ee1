"""Flower server glue: the generic bundle strategy, thin named strategies, and the ServerApp.

Named strategies (``PVIStrategy``, ...) are imported on first use, so the generic pieces never
depend on a family.
"""

import importlib

from .base import BundleStrategy
from .nodes import partition_map
from .server_app import app, make_server_app

_NAMED = {"PVIStrategy": ".pvi", "AsyncPVIStrategy": ".pvi", "DSVGDStrategy": ".dsvgd",
          "AMPSStrategy": ".amps", "PDMCStrategy": ".pdmc",
          "DecentralizedHMCStrategy": ".dhmc", "GossipRouter": ".gossip"}

__all__ = ["AMPSStrategy", "AsyncPVIStrategy", "BundleStrategy", "DSVGDStrategy",
           "DecentralizedHMCStrategy", "GossipRouter", "PDMCStrategy", "PVIStrategy", "app",
           "make_server_app", "partition_map"]


def __getattr__(name: str):
    if name in _NAMED:
        return getattr(importlib.import_module(_NAMED[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
