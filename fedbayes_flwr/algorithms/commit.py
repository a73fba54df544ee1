"""Commit on acknowledgement: a client's new value stays *pending* until the server says, in its
next request, that the reply carrying it was applied; a value whose reply was rejected is dropped,
so client and server never disagree (PVI's factor ``t_k``; DSVGD's local particles).

The server keeps, per partition, the last request round whose reply it applied
(``accepted_round``) and sends it back with the next request; the client calls
:func:`acknowledge` with it before doing anything else.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

NO_ROUND = -1


class Pending(NamedTuple):
    """A committed value and the value waiting for the server's acknowledgement.

    Attributes
    ----------
    value : NamedTuple
        The committed value (the server applied the reply that carried it).
    pending : NamedTuple
        The value proposed with the reply to request ``pending_round`` (equal to ``value`` when
        nothing is pending).
    pending_round : int
        Request round of the pending value, ``NO_ROUND`` when nothing is pending.
    """

    value: Any
    pending: Any
    pending_round: int


def init(value) -> Pending:
    """Nothing pending."""
    return Pending(value, value, NO_ROUND)


def propose(state: Pending, value, request_round: int) -> Pending:
    """Hold ``value`` until the server acknowledges the reply to ``request_round``."""
    return Pending(state.value, value, int(request_round))


def acknowledge(state: Pending, accepted_round: int) -> Pending:
    """Commit the pending value if the server applied its reply (``accepted_round`` equals the
    pending round), else drop it."""
    if state.pending_round == NO_ROUND:
        return state
    value = state.pending if state.pending_round == accepted_round else state.value
    return init(value)


def record_accepted(accepted_round: np.ndarray, partition_id: int, request_round: int) -> np.ndarray:
    """Server side: a copy of ``accepted_round`` noting that ``partition_id``'s reply to
    ``request_round`` was applied."""
    out = accepted_round.copy()
    out[partition_id] = request_round
    return out
