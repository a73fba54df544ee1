"""Flower client glue: the generic handler and the ClientApp. No maths here."""

from .client_app import BundleClientApp, app, make_client_app
from .handler import handle

__all__ = ["BundleClientApp", "app", "handle", "make_client_app"]
