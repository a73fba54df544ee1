"""Flower server glue: one Strategy per algorithm, and the ServerApp. No maths here."""

from .nodes import partition_map
from .pvi import PVIStrategy
from .pvi_async import AsyncPVIStrategy
from .server_app import app, make_server_app

__all__ = ["AsyncPVIStrategy", "PVIStrategy", "app", "make_server_app", "partition_map"]
