"""Fault injection (the ``inject-fault`` testing hook) and simulated client slowness.

``inject-fault=KIND@ROUND:PARTITION`` makes partition ``PARTITION``'s reply to its ``train``
request of update ``ROUND`` bad: ``nan`` (the reply's first float array filled with NaN: generic),
a bundle-specific kind such as ``negative-precision`` (the bundle's ``corrupt`` hook), ``error``
(the client fails) or ``drop`` (the reply never arrives). Both engines apply the same rule.
"""

from __future__ import annotations

import numpy as np

from .config import RunConfig, parse_fault, straggler_ids


class InjectedFault(RuntimeError):
    """The client fails on purpose (``error`` / ``drop``)."""

    def __init__(self, kind: str):
        super().__init__(f"injected fault {kind!r} (inject-fault)")
        self.kind = kind


def active_fault(config: RunConfig, number: int, partition_id: int, category: str,
                 attempt: int = 0) -> str | None:
    """The fault kind injected into this client's reply, if any: train requests only, first
    attempt only (a transient fault: a ``retry``-policy bundle's re-send succeeds)."""
    fault = parse_fault(config.inject_fault)
    if (category == "train" and attempt == 0 and fault and fault[1] == number
            and fault[2] == partition_id):
        return fault[0]
    return None


def _nan_first_float_array(message):
    for i, value in enumerate(message):
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            changed = _nan_first_float_array(value)
            if changed is not None:
                return message._replace(**{message._fields[i]: changed})
        elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return message._replace(**{message._fields[i]: np.full_like(value, np.nan)})
    return None


def corrupt(bundle, kind: str, reply, request):
    """Turn a good reply into a bad one of ``kind`` (see the module docstring)."""
    if kind == "nan":
        bad = _nan_first_float_array(reply)
        if bad is None:
            raise ValueError(f"bundle {bundle.name!r}: its reply has no float array to corrupt")
        return bad
    if bundle.corrupt is None:
        raise ValueError(f"bundle {bundle.name!r} cannot make a {kind!r} fault")
    return bundle.corrupt(kind, reply, request)


def client_durations(config: RunConfig, num_clients: int) -> np.ndarray:
    """Time one update takes on each client: ``client-delay`` (or 1 virtual unit when 0) times
    ``straggler-factor`` for the partitions listed in ``stragglers``."""
    base = config.client_delay if config.client_delay > 0 else 1.0
    durations = np.full(num_clients, base)
    for k in straggler_ids(config):
        durations[k] *= config.straggler_factor
    return durations


def client_delay_s(config: RunConfig, partition_id: int) -> float:
    """Seconds a real client waits before each update (0 unless ``client-delay`` > 0)."""
    if config.client_delay <= 0:
        return 0.0
    return float(client_durations(config, config.num_clients)[partition_id])
