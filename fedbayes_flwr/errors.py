"""Errors shared by the configuration, the registry and the algorithm bundles."""

from __future__ import annotations


class ConfigError(ValueError):
    """A run-config key is unknown or has a bad value (the message is one line naming the key)."""
