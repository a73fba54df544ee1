"""Flower client glue: message handlers that call the library. No maths here."""

from .client_app import app, make_client_app
from .pvi import pvi_evaluate_handler, pvi_train_handler

__all__ = ["app", "make_client_app", "pvi_evaluate_handler", "pvi_train_handler"]
