"""Errors shared by the configuration, the registry and the algorithm bundles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A run-config key is unknown or has a bad value (the message is one line naming the key)."""


class RunStopped(RuntimeError):
    """A bundle with the ``stop`` failure policy met a failure, or a bundle cannot go on (its
    ``server_step`` may raise it); ``reason`` is one line. The engines save the samples so far
    (``state``: the server state when the run stopped, where an engine knows it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.state: Any = None
        self.update = 0  # the updates ``state`` has made (where an engine knows it)
        self.log: Any = None  # what happened since the last history row (the engine's RoundLog)
        self.save: Callable[[], None] | None = None  # checkpoints ``state`` (the engine's hook)


class DeploymentError(RuntimeError):
    """The deployment could not start or its run did not complete; one line saying why."""
