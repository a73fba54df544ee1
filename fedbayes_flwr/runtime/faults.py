"""Fault injection (the ``inject-fault`` testing hook) and simulated client slowness.

``inject-fault=KIND@ROUND:PARTITION`` (several specs comma-separated) makes partition ``PARTITION``
fail. One-shot kinds hit its reply to its first ``train`` request at or after update ``ROUND`` (on
every schedule: a sequential or asynchronous one does not ask every partition at every update),
first attempt only (a retry succeeds): ``nan`` (the reply's first float array filled with NaN:
generic), a bundle-specific kind such as ``negative-precision`` (the bundle's ``corrupt`` hook),
``garbage`` (every array of the reply replaced by bytes that are not the action's record: wrong
dtype and length), ``huge`` (every float array of the reply multiplied by :data:`HUGE_FACTOR`:
finite and well-formed, but past what one client may do, which each bundle's ``check`` bounds,
:mod:`fedbayes_flwr.algorithms.bounds`), ``error`` (the client fails) or ``drop`` (the reply
never arrives). Lasting kinds hit every request of every category (train, evaluate, query) from
update ``ROUND`` on, every attempt: ``raise-always`` (the client raises) and ``hang`` (the client
never answers: a Flower ClientApp sleeps :func:`hang_seconds`, past the message's time-to-live,
then raises, so its process ends; the in-process engine records the timeout at once, without
sleeping). Both engines apply the same rule. """

from __future__ import annotations

import numpy as np

from fedbayes_flwr.runtime.config import RunConfig, parse_faults, straggler_ids

# kinds that last from their update on, for every request and attempt; the others are one-shot
LASTING = ("raise-always", "hang")
# kinds the client raises (InjectedFault) instead of replying
RAISED = ("error", "drop", *LASTING)
# a hung Flower ClientApp wakes this long after its message's time-to-live (then raises)
HANG_MARGIN_S = 2.0
# the request envelope's key for the update of the partition's previous train request (Flower)
PREVIOUS_TRAIN = "previous-train"
GARBAGE = np.frombuffer(b"\x00garbage\xff", dtype=np.uint8)
# the ``huge`` fault's factor: finite for any entry below 1.8e208, far past every reply bound
HUGE_FACTOR = 1e100


class InjectedFault(RuntimeError):
    """The client fails on purpose (``error``, ``drop``, ``raise-always``, ``hang``)."""

    def __init__(self, kind: str):
        super().__init__(f"injected fault {kind!r} (inject-fault)")
        self.kind = kind


def active_fault(config: RunConfig, number: int, partition_id: int, category: str,
                 attempt: int = 0, previous: int | None = None) -> str | None:
    """The fault kind injected into this client's reply, if any (the first matching spec):
    one-shot kinds on the partition's first train request at or after their update (``previous
    < ROUND <= number``, ``previous`` the update of the partition's previous train request: a
    sequential or asynchronous schedule does not ask every partition at every update), first
    attempt only (a transient fault: a ``retry``-policy bundle's re-send succeeds); lasting
    kinds (:data:`LASTING`) on every request from their update on, every attempt. Without
    ``previous`` a one-shot kind fires at ``number == ROUND`` only."""
    for kind, rnd, pid in parse_faults(config.inject_fault):
        if pid != partition_id:
            continue
        if kind in LASTING:
            if number >= rnd:
                return kind
        elif category == "train" and attempt == 0 and (
                number == rnd if previous is None else previous < rnd <= number):
            return kind
    return None


def hang_seconds(ttl: float) -> float:
    """How long a ``hang`` ClientApp sleeps for a message with time-to-live ``ttl`` (seconds):
    past the ttl, so its reply can never count, and bounded, so its process ends."""
    return float(ttl) + HANG_MARGIN_S


def _nan_first_float_array(message):
    for i, value in enumerate(message):
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            changed = _nan_first_float_array(value)
            if changed is not None:
                return message._replace(**{message._fields[i]: changed})
        elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return message._replace(**{message._fields[i]: np.full_like(value, np.nan)})
    return None


def _garbage(message):
    """``message`` with every array (nested too) replaced by :data:`GARBAGE` bytes."""
    out = {}
    for name, value in zip(message._fields, message, strict=True):
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            out[name] = _garbage(value)
        elif isinstance(value, np.ndarray):
            out[name] = GARBAGE.copy()
    return message._replace(**out)


def _huge(message):
    """``message`` with every float array (nested too) multiplied by :data:`HUGE_FACTOR`."""
    out = {}
    for name, value in zip(message._fields, message, strict=True):
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            out[name] = _huge(value)
        elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                out[name] = value * HUGE_FACTOR
    return message._replace(**out)


def corrupt(bundle, kind: str, reply, request):
    """Turn a good reply into a bad one of ``kind`` (see the module docstring)."""
    if kind == "garbage":
        return _garbage(reply)
    if kind == "huge":
        return _huge(reply)
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
