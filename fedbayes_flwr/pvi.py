"""Partitioned variational inference (PVI) as pure functions over NamedTuple states.

The server keeps ``q = p x prod_k t_k`` in natural parameters. A selected client ``k`` receives
``q``, forms its cavity ``q / t_k``, finds the local optimum ``q_k`` of the local free energy
against that cavity, and returns the damped natural-parameter change of its factor

    delta_k = rho * (q_k / q_cav - t_k)          (natural parameters)

The server multiplies ``q`` by every accepted ``delta_k``. Schedules: ``synchronous`` (all clients
each round) and ``sequential`` (one client per round, each pass in a seeded order).

Damping ``rho`` is applied ONCE, by the client, to its delta; the server applies the delta as
received (so client and server never both damp).

A client keeps its factor ``t_k`` between rounds. Its new factor stays *pending* until the server
tells it (in the next message, ``accepted_round``) that the round's delta was applied; a delta the
server rejected is then discarded, so client and server never disagree about ``t_k``.

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning": Algorithm 1 (client selection, local update, server update), eq. (2) (local free
energy), eq. (3) (factor update by division), Section 2.4 (schedules, damping) and Section 2.2
(the sum of local free energies is the global free energy).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import gaussian as G
from .gaussian import NaturalGaussian
from .seeds import derive_seed, numpy_rng
from .vi import VIConfig, fit_gaussian

SCHEDULES = ("synchronous", "sequential")
NO_ROUND = -1
# Key prefixes of the encoded messages (see fedbayes_flwr.codec) and of the stored client state.
KIND_TRAIN, KIND_REPLY, KIND_EVAL, KIND_TERM = "pvi.train", "pvi.reply", "pvi.eval", "pvi.term"
KIND_STATE = "pvi.client-state"


class PVIConfig(NamedTuple):
    """PVI hyper-parameters (run-config keys in brackets).

    Attributes
    ----------
    damping : float
        ``rho`` in (0, 1] applied to each client's delta (``damping``).
    schedule : str
        ``synchronous`` or ``sequential`` (``schedule``).
    vi : VIConfig
        Local optimiser for non-conjugate models (``local-steps``, ``learning-rate``,
        ``mc-samples``, ``batch-size``).
    closed_form : bool
        Use the exact local optimum for conjugate models (always on for them).
    """

    damping: float = 1.0
    schedule: str = "synchronous"
    vi: VIConfig = VIConfig()
    closed_form: bool = True


class ServerState(NamedTuple):
    """Server state: prior, current posterior, round, last accepted round per partition."""

    prior: NaturalGaussian
    posterior: NaturalGaussian
    server_round: int
    accepted_round: np.ndarray  # int64 (num_clients,), NO_ROUND where nothing accepted yet


class ClientState(NamedTuple):
    """Client state: its accepted factor ``t_k`` and the factor waiting for acceptance."""

    factor: NaturalGaussian
    pending: NaturalGaussian
    pending_round: int


class ServerMessage(NamedTuple):
    """What the server sends a client: ``q``, the round, its seed, and the ack of its last delta."""

    posterior: NaturalGaussian
    server_round: int
    accepted_round: int
    seed: np.ndarray


class ClientMessage(NamedTuple):
    """What a client returns: the damped natural-parameter delta of its factor."""

    delta: NaturalGaussian
    num_examples: int


class EvalMessage(NamedTuple):
    """Free-energy query: the current ``q`` and the ack of the client's last delta."""

    posterior: NaturalGaussian
    accepted_round: int


class EvalReply(NamedTuple):
    """A client's free-energy term (a float64 array of shape (1,))."""

    term: np.ndarray


class TrainRequest(NamedTuple):
    """Transport envelope: the server message plus the hyper-parameters the client must use."""

    message: ServerMessage
    config: PVIConfig


class Rejection(NamedTuple):
    """A reply the server refused, with the field and the reason."""

    partition_id: int
    field: str
    reason: str


class ServerInfo(NamedTuple):
    accepted: tuple[int, ...]
    rejected: tuple[Rejection, ...]


def init_server(prior: NaturalGaussian, num_clients: int) -> ServerState:
    """Start with ``q = prior`` and every ``t_k = 1``."""
    G.check_proper(prior, "prior")
    return ServerState(prior, prior, 0, np.full(num_clients, NO_ROUND, dtype=np.int64))


def init_client(prior: NaturalGaussian) -> ClientState:
    """A client starts with ``t_k = 1`` (zero natural parameters) of the prior's structure."""
    flat = G.zeros(prior.dim, prior.is_diag)
    return ClientState(flat, flat, NO_ROUND)


def select_clients(run_seed: int, server_round: int, num_clients: int, schedule: str) -> list[int]:
    """Partitions updated in ``server_round`` (1-based), sorted.

    ``sequential`` visits every client once per pass of ``num_clients`` rounds, each pass in a
    permutation seeded by (run seed, pass).
    """
    if schedule == "synchronous":
        return list(range(num_clients))
    if schedule == "sequential":
        pass_index, position = divmod(server_round - 1, num_clients)
        order = numpy_rng(derive_seed(run_seed, "pvi-order", pass_index, -1)).permutation(
            num_clients)
        return [int(order[position])]
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def broadcast(state: ServerState, partition_id: int, run_seed: int) -> ServerMessage:
    """The message for ``partition_id`` in the coming round ``state.server_round + 1``."""
    server_round = state.server_round + 1
    return ServerMessage(state.posterior, server_round, int(state.accepted_round[partition_id]),
                         derive_seed(run_seed, "pvi", server_round, partition_id))


def sync_client(state: ClientState, accepted_round: int) -> ClientState:
    """Commit the pending factor if the server accepted it, else drop it."""
    if state.pending_round == NO_ROUND:
        return state
    factor = state.pending if state.pending_round == accepted_round else state.factor
    return ClientState(factor, factor, NO_ROUND)


def local_optimum(seed, model, x, y, cavity: NaturalGaussian, init: NaturalGaussian,
                  config: PVIConfig) -> NaturalGaussian:
    """``argmax_q F_k(q)``: closed form for conjugate models, Monte-Carlo VI otherwise.

    For a conjugate model the tilted distribution ``q_cav x p(y_k | theta)`` is Gaussian; a full
    covariance family takes it exactly, a mean-field family takes its KL projection.
    """
    factor = model.likelihood_factor(x, y) if config.closed_form else None
    if factor is not None:
        tilted = G.add(G.like(factor, cavity), factor)
        return G.to_diag(tilted) if init.is_diag else tilted
    return fit_gaussian(seed, model, x, y, cavity, init, config.vi)


def client_step(state: ClientState, message: ServerMessage, model, x, y,
                config: PVIConfig) -> tuple[ClientState, ClientMessage]:
    """One client update (Algorithm 1, step 2).

    Returns the new client state (the new factor pending) and the reply carrying
    ``delta = rho * (t_new - t_old)``.
    """
    state = sync_client(state, message.accepted_round)
    cavity = G.sub(message.posterior, state.factor)
    q_new = local_optimum(message.seed, model, x, y, cavity, message.posterior, config)
    t_new = G.sub(q_new, cavity)
    delta = G.scale(G.sub(t_new, state.factor), config.damping)
    pending = G.add(state.factor, delta)
    return ClientState(state.factor, pending, message.server_round), ClientMessage(
        delta, int(x.shape[0]))


def check_delta(posterior: NaturalGaussian, delta: NaturalGaussian) -> tuple[str, str] | None:
    """Return ``(field, reason)`` if ``delta`` cannot be applied to ``posterior``, else ``None``."""
    for field, got, want in (("delta.eta1", delta.eta1, posterior.eta1),
                             ("delta.eta2", delta.eta2, posterior.eta2)):
        if got.shape != want.shape:
            return field, f"shape {got.shape}, expected {want.shape}"
        if got.dtype != np.float64:
            return field, f"dtype {got.dtype}, expected float64"
        if not np.all(np.isfinite(got)):
            return field, "non-finite values"
    if not G.is_proper(G.add(posterior, delta)):
        return "delta.eta2", "update makes the posterior precision non-positive-definite"
    return None


def server_step(state: ServerState,
                replies: list[tuple[int, ClientMessage | Rejection]]) -> tuple[ServerState,
                                                                               ServerInfo]:
    """Apply the round's replies in partition order (Algorithm 1, step 3).

    ``replies`` pairs each partition id with its decoded reply, or with a :class:`Rejection` made
    by the transport (undecodable reply, client error). A reply that fails :func:`check_delta` is
    rejected and leaves the posterior untouched.
    """
    posterior = state.posterior
    accepted_round = state.accepted_round.copy()
    server_round = state.server_round + 1
    accepted, rejected = [], []
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        problem = check_delta(posterior, reply.delta)
        if problem is not None:
            rejected.append(Rejection(pid, *problem))
            continue
        posterior = G.add(posterior, reply.delta)
        accepted_round[pid] = server_round
        accepted.append(pid)
    new_state = ServerState(state.prior, posterior, server_round, accepted_round)
    return new_state, ServerInfo(tuple(accepted), tuple(rejected))


def free_energy_term(state: ClientState, posterior: NaturalGaussian, accepted_round: int, model,
                     x, y) -> tuple[ClientState, float]:
    """Client ``k``'s share of the global free energy at ``q``.

    ``F(q) = sum_k (E_q[log p(y_k | theta)] - E_q[eta_k . T(theta)]) + A(eta_q) - A(eta_0)``
    (Ashman et al. 2022, Section 2.2 and B.2: the sum of local free energies is the global free
    energy). The client computes its bracket; the server adds the log-normaliser difference.
    """
    from .posterior import GaussianPosterior

    state = sync_client(state, accepted_round)
    term = model.expected_log_likelihood(GaussianPosterior(posterior), x, y)
    return state, term - G.expected_dot(state.factor, posterior)


def log_marginal_likelihood(state: ServerState, terms: list[float]) -> float:
    """Server side of :func:`free_energy_term`: the global free energy, a lower bound on
    ``log p(y)`` that is tight at the exact posterior of a conjugate model."""
    return float(np.sum(terms) + G.log_partition(state.posterior) - G.log_partition(state.prior))
