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
from .vi import VIConfig, fit_fixed_point, fit_gaussian

SCHEDULES = ("synchronous", "sequential", "asynchronous")
CAVITIES = ("pvi", "no-deletion", "same-prior", "split-prior")
LOCAL_OPTIMISERS = ("adam", "fixed-point")
NO_ROUND = -1
# Key prefixes of the encoded messages (see fedbayes_flwr.codec) and of the stored client state.
KIND_TRAIN, KIND_REPLY, KIND_EVAL, KIND_TERM = "pvi.train", "pvi.reply", "pvi.eval", "pvi.term"
KIND_STATE = "pvi.client-state"


class PVIConfig(NamedTuple):
    """PVI hyper-parameters (run-config keys in brackets).

    Attributes
    ----------
    damping : float
        ``rho`` in (0, 1] applied by each client to its delta (``damping``).
    schedule : str
        ``synchronous``, ``sequential`` or ``asynchronous`` (``schedule``).
    vi : VIConfig
        Adam local optimiser for non-conjugate models (``local-steps``, ``learning-rate``,
        ``mc-samples``, ``batch-size``).
    closed_form : bool
        Use the exact local optimum for conjugate models.
    server_damping : float
        ``rho_s`` in (0, 1] the server applies to every accepted delta (``server-damping``). The
        client commits ``t_k + rho_s * delta``, so client and server agree; the effective step
        is ``damping * server-damping`` (set one of the two, not both).
    cavity : str
        ``pvi`` (``q / t_k``), ``no-deletion`` (``q``: streaming VB / VCL), ``same-prior`` (``p``:
        BCM) or ``split-prior`` (``p^(1/M)``: BCM with split prior).
    local_optimiser : str
        ``adam`` (Monte-Carlo ELBO) or ``fixed-point`` (damped natural-gradient fixed-point
        iterations; ``fixed-point-iterations``, ``local-damping``).
    fixed_point_iterations : int
    local_damping : float
    """

    damping: float = 1.0
    schedule: str = "synchronous"
    vi: VIConfig = VIConfig()
    closed_form: bool = True
    server_damping: float = 1.0
    cavity: str = "pvi"
    local_optimiser: str = "adam"
    fixed_point_iterations: int = 30
    local_damping: float = 0.5


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
    if schedule in ("synchronous", "asynchronous"):  # asynchronous: everyone starts at once
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
    """``argmax_q F_k(q)``: closed form for conjugate models, else the configured optimiser.

    For a conjugate model the tilted distribution ``q_cav x p(y_k | theta)`` is Gaussian; a full
    covariance family takes it exactly, a mean-field family takes its KL projection.
    """
    factor = model.likelihood_factor(x, y) if config.closed_form else None
    if factor is not None:
        tilted = G.add(G.like(factor, cavity), factor)
        return G.to_diag(tilted) if init.is_diag else tilted
    if config.local_optimiser == "fixed-point":
        return fit_fixed_point(seed, model, x, y, cavity, init, config.fixed_point_iterations,
                               config.local_damping, config.vi.mc_samples)
    return fit_gaussian(seed, model, x, y, cavity, model.local_init(init, x.shape[1]), config.vi)


def cavity_for(config: PVIConfig, posterior: NaturalGaussian, factor: NaturalGaussian,
               prior: NaturalGaussian | None, num_clients: int) -> NaturalGaussian:
    """The effective prior of the local problem for each algorithm of the PVI family.

    References
    ----------
    Ashman et al. (2022), Section 4 and 5: PVI (``q / t_k``), streaming VB / VCL without deletion
    (``q``), Bayesian committee machines with the same prior (``p``) or a split prior (``p^(1/M)``).
    """
    if config.cavity == "pvi":
        return G.sub(posterior, factor)
    if config.cavity == "no-deletion":
        return posterior
    if prior is None:
        raise ValueError(f"cavity {config.cavity!r} needs the prior")
    prior = G.like(posterior, prior)
    return prior if config.cavity == "same-prior" else G.scale(prior, 1.0 / num_clients)


def client_step(state: ClientState, message: ServerMessage, model, x, y, config: PVIConfig,
                prior: NaturalGaussian | None = None,
                num_clients: int = 1) -> tuple[ClientState, ClientMessage]:
    """One client update (Algorithm 1, step 2).

    Returns the new client state (the new factor pending) and the reply carrying
    ``delta = rho * (t_new - t_old)``. ``prior`` and ``num_clients`` are needed by the BCM cavities
    only. Without deletion (streaming VB) the factor grows by ``q_new / q`` every visit.
    """
    state = sync_client(state, message.accepted_round)
    cavity = cavity_for(config, message.posterior, state.factor, prior, num_clients)
    q_new = local_optimum(message.seed, model, x, y, cavity, message.posterior, config)
    if config.cavity == "no-deletion":
        change = G.sub(q_new, message.posterior)
    else:
        change = G.sub(G.sub(q_new, cavity), state.factor)
    delta = G.scale(change, config.damping)
    pending = G.add(state.factor, G.scale(delta, config.server_damping))
    return ClientState(state.factor, pending, message.server_round), ClientMessage(
        delta, int(x.shape[0]), message.server_round)


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


def server_step(state: ServerState, replies: list[tuple[int, ClientMessage | Rejection]],
                server_damping: float = 1.0) -> tuple[ServerState, ServerInfo]:
    """Apply the round's replies in partition order (Algorithm 1, step 3).

    ``replies`` pairs each partition id with its decoded reply, or with a :class:`Rejection` made
    by the transport (undecodable reply, client error). Each accepted delta is scaled by
    ``server_damping``. A reply that fails :func:`check_delta` is rejected and leaves the
    posterior untouched. One call is one server update (asynchronous PVI calls it per reply).
    """
    posterior = state.posterior
    accepted_round = state.accepted_round.copy()
    server_round = state.server_round + 1
    accepted, rejected = [], []
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        damped = G.scale(reply.delta, server_damping)
        problem = check_delta(posterior, damped)
        if problem is not None:
            rejected.append(Rejection(pid, *problem))
            continue
        posterior = G.add(posterior, damped)
        accepted_round[pid] = reply.request_round
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


def optimise_prior_scale(state: ServerState) -> tuple[ServerState, float]:
    """Variational-EM step for the prior scale: maximise the free energy over ``s`` in
    ``p = N(0, s^2 I)`` with ``q`` fixed, ``s^2 = E_q[theta^T theta] / d``, then rebuild
    ``q = p_new x prod t_k`` (the factors are unchanged).

    For conjugate models the factors are exact, so the iteration is EM on the evidence
    ``log p(y | s)`` and converges to its maximiser.

    References
    ----------
    Ashman et al. (2022), Appendix A (hyperparameter learning by maximising the free energy).
    """
    mean, cov = G.to_moments(state.posterior)
    second = float(mean @ mean + (cov.sum() if state.posterior.is_diag else np.trace(cov)))
    scale = float(np.sqrt(second / state.posterior.dim))
    var = np.full(state.posterior.dim, scale**2)
    prior = G.from_moments(np.zeros(state.posterior.dim), var if state.prior.is_diag else np.diag(var))
    posterior = G.add(G.sub(state.posterior, state.prior), prior)
    return state._replace(prior=prior, posterior=posterior), scale
