"""PVI's states and messages: the server state, the client state (a pending factor), and the
NamedTuples each exchange carries (train, free-energy query, step-search candidates).

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning", Algorithm 1 (what the server sends and what a client returns).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.base import Rejection
from fedbayes_flwr.algorithms.commit import Pending
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.inference.gaussian import NaturalGaussian

#: The server's phases: train (collect the clients' changes), evaluate (the free-energy query),
#: search (the step search's candidate exchange).
PHASE_TRAIN, PHASE_EVALUATE, PHASE_SEARCH = 0, 1, 2

class ServerState(NamedTuple):
    """Server state: prior, current posterior, round, last accepted round per partition, and
    what the next exchange is (``phase``: train, the free-energy query, or a step search).

    With server-held factors it also holds every client's factor ``factors`` (stacked:
    ``eta1 (M, d)``, ``eta2 (M, d[, d])``), the round's undamped deltas ``deltas`` and which
    clients sent one (``received``), the search exchanges made this round (``search``), the free
    energy of ``posterior`` (``free_energy``, NaN when not every client evaluated it) and the
    Anderson history. A DP run (``pvi.dp``) holds, per client, the rows it reported
    (``dp_examples``) and the rounds it was asked to train in (``dp_participations``): the
    privacy accountant's inputs (:mod:`fedbayes_flwr.algorithms.pvi.privacy`).
    """

    prior: NaturalGaussian
    posterior: NaturalGaussian
    server_round: int
    accepted_round: np.ndarray  # int64 (num_clients,), NO_ROUND where nothing accepted yet
    phase: int = PHASE_TRAIN
    factors: NaturalGaussian | None = None
    deltas: NaturalGaussian | None = None
    received: np.ndarray | None = None
    search: int = 0
    free_energy: float = float("nan")
    history: S.History | None = None
    last_step: float = float("nan")  # the step taken last round (step memory); NaN: none yet
    recent: tuple = ()  # free energies of the last rounds (non-monotone window), oldest first
    proximal: float = 0.0  # the proximal weight beta of the next round's local solves
    dp_examples: np.ndarray | None = None  # DP runs: each client's rows (0: not reported yet)
    dp_participations: np.ndarray | None = None  # DP runs: train requests each client answered


# Client state: the accepted factor t_k (``value``) and the factor waiting for the server's ack
# (the shared commit-on-acknowledgement helper, :mod:`fedbayes_flwr.algorithms.commit`).
ClientState = Pending


class NoState(NamedTuple):
    """Client state with server-held factors: nothing (an empty array, so checkpoints and
    Flower's ``context.state`` have nothing to keep or restore)."""

    nothing: np.ndarray


class ServerMessage(NamedTuple):
    """What the server sends a client: ``q``, the round, and the ack of its last delta."""

    posterior: NaturalGaussian
    server_round: int
    accepted_round: int


class ClientMessage(NamedTuple):
    """What a client returns: the damped natural-parameter delta of its factor, and the round tag
    of the request it answers (echoed back, so a late asynchronous reply is acknowledged right)."""

    delta: NaturalGaussian
    num_examples: int
    request_round: int


class EvalMessage(NamedTuple):
    """Free-energy query: the current ``q`` and the ack of the client's last delta."""

    posterior: NaturalGaussian
    accepted_round: int


class EvalReply(NamedTuple):
    """A client's free-energy term (a float64 array of shape (1,))."""

    term: np.ndarray


class StepMessage(NamedTuple):
    """Server-held factors: ``q``, the client's factor ``t_k`` as the server holds it, the
    round (echoed back) and the proximal weight ``beta`` of the local solve (``pvi.proximal``)."""

    posterior: NaturalGaussian
    factor: NaturalGaussian
    server_round: int
    proximal: float = 0.0


class CandidateMessage(NamedTuple):
    """The step search: candidate posteriors stacked (``eta1 (C, d)``, ``eta2 (C, d[, d])``);
    candidate 0 is the current ``q``."""

    eta1: np.ndarray
    eta2: np.ndarray


class CandidateReply(NamedTuple):
    """A client's ``E_q[log p(y_k | theta)]`` at every candidate, float64 ``(C,)``."""

    expected_log_likelihood: np.ndarray


class ServerInfo(NamedTuple):
    accepted: tuple[int, ...]
    rejected: tuple[Rejection, ...]
