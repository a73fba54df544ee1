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

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import gaussian as G
from ..errors import ConfigError
from ..gaussian import NaturalGaussian
from ..seeds import derive_seed, numpy_rng
from ..vi import VIConfig, fit_fixed_point, fit_gaussian, solve_local
from . import commit
from .base import ActionSpec, Bundle, Rejection, Request, StepInfo
from .commit import NO_ROUND, Pending

SCHEDULES = ("synchronous", "sequential", "asynchronous")
CAVITIES = ("pvi", "no-deletion", "same-prior", "split-prior")
LOCAL_OPTIMISERS = ("auto", "adam", "fixed-point")
COVARIANCES = ("auto", "full", "diag")
TRAIN, EVALUATE = "train", "evaluate"
_PHASE_TRAIN, _PHASE_EVALUATE = 0, 1


@dataclass(frozen=True)
class PVIConfig:
    """PVI hyper-parameters: the run-config section ``[tool.flwr.app.config.pvi]`` (``pvi.<key>``).

    Attributes
    ----------
    schedule : str
        ``synchronous``, ``sequential`` or ``asynchronous`` (``pvi.schedule``).
    damping : float
        ``rho`` in (0, 1] applied by each client to its delta (``pvi.damping``).
    server_damping : float
        ``rho_s`` in (0, 1] the server applies to every accepted delta; the client commits
        ``t_k + rho_s * delta``, so client and server agree; the effective step is
        ``damping * server-damping`` (set one of the two).
    covariance : str
        ``auto`` (mean-field for BNNs, full otherwise), ``full`` or ``diag``.
    local_optimiser : str
        ``auto`` (the deterministic solver :func:`fedbayes_flwr.vi.solve_local` for models with
        exact expectations, i.e. linear and logistic models; Adam for BNNs), ``adam``
        (Monte-Carlo ELBO) or ``fixed-point`` (damped natural-gradient iterations).
    local_steps, learning_rate, mc_samples, batch_size : int, float, int, int
        Adam settings (:class:`fedbayes_flwr.vi.VIConfig`).
    fixed_point_iterations, local_damping : int, float
        Fixed-point settings (also the budget and step of ``auto`` before its quasi-Newton
        fallback).
    optimise_prior : bool
        Learn the prior scale by maximising the free energy after each update (Appendix A).
    cavity : str
        ``pvi`` (``q / t_k``), ``no-deletion`` (``q``: streaming VB / VCL), ``same-prior``
        (``p``: BCM) or ``split-prior`` (``p^(1/M)``: BCM with split prior); set by the presets.
    closed_form : bool
        Take the exact local optimum of conjugate models (false: use the local optimiser even
        there, e.g. to test it).
    """

    schedule: str = "synchronous"
    damping: float = 0.5
    server_damping: float = 1.0
    covariance: str = "auto"
    local_optimiser: str = "auto"
    local_steps: int = 1000
    learning_rate: float = 0.1
    mc_samples: int = 10
    batch_size: int = 0
    fixed_point_iterations: int = 30
    local_damping: float = 0.5
    optimise_prior: bool = False
    cavity: str = "pvi"
    closed_form: bool = True

    @property
    def vi(self) -> VIConfig:
        return VIConfig(self.local_steps, self.learning_rate, self.mc_samples, self.batch_size)

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use;
        ``run`` is the whole :class:`fedbayes_flwr.config.RunConfig`."""
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"pvi.{key}: {msg}")

        for key, value, allowed in (("schedule", self.schedule, SCHEDULES),
                                    ("covariance", self.covariance, COVARIANCES),
                                    ("local-optimiser", self.local_optimiser, LOCAL_OPTIMISERS),
                                    ("cavity", self.cavity, CAVITIES)):
            need(value in allowed, key,
                 f"unknown {key.replace('-', ' ')} {value!r}; choose one of {', '.join(allowed)}")
        for key, value in (("damping", self.damping), ("server-damping", self.server_damping),
                           ("local-damping", self.local_damping)):
            need(0 < value <= 1, key, f"must be in (0, 1], got {value}")
        need(self.fixed_point_iterations >= 1, "fixed-point-iterations",
             f"must be >= 1, got {self.fixed_point_iterations}")
        need(self.local_steps >= 1, "local-steps", f"must be >= 1, got {self.local_steps}")
        need(self.learning_rate > 0, "learning-rate", f"must be > 0, got {self.learning_rate}")
        need(self.mc_samples >= 1, "mc-samples", f"must be >= 1, got {self.mc_samples}")
        need(self.batch_size >= 0, "batch-size",
             f"must be >= 0 (0 = full batch), got {self.batch_size}")
        need(not (run.model.startswith("bnn-") and self.covariance == "full"), "covariance",
             f"model {run.model!r} supports only a mean-field posterior; use covariance='diag'")


class ServerState(NamedTuple):
    """Server state: prior, current posterior, round, last accepted round per partition, and
    whether the next exchange is the free-energy query (``phase``)."""

    prior: NaturalGaussian
    posterior: NaturalGaussian
    server_round: int
    accepted_round: np.ndarray  # int64 (num_clients,), NO_ROUND where nothing accepted yet
    phase: int = _PHASE_TRAIN


# Client state: the accepted factor t_k (``value``) and the factor waiting for the server's ack
# (the shared commit-on-acknowledgement helper, :mod:`fedbayes_flwr.algorithms.commit`).
ClientState = Pending


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


class ServerInfo(NamedTuple):
    accepted: tuple[int, ...]
    rejected: tuple[Rejection, ...]


def init_server(prior: NaturalGaussian, num_clients: int) -> ServerState:
    """Start with ``q = prior`` and every ``t_k = 1``."""
    G.check_proper(prior, "prior")
    return ServerState(prior, prior, 0, np.full(num_clients, NO_ROUND, dtype=np.int64))


def init_client(prior: NaturalGaussian) -> ClientState:
    """A client starts with ``t_k = 1`` (zero natural parameters) of the prior's structure."""
    return commit.init(G.zeros(prior.dim, prior.is_diag))


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


def broadcast(state: ServerState, partition_id: int) -> ServerMessage:
    """The message for ``partition_id`` in the coming round ``state.server_round + 1``."""
    return ServerMessage(state.posterior, state.server_round + 1,
                         int(state.accepted_round[partition_id]))


def sync_client(state: ClientState, accepted_round: int) -> ClientState:
    """Commit the pending factor if the server accepted it, else drop it."""
    return commit.acknowledge(state, accepted_round)


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
    optimiser = config.local_optimiser
    if optimiser == "auto":
        optimiser = "solve" if model.deterministic_expectations else "adam"
    if optimiser == "solve":
        return solve_local(model, x, y, cavity, init)
    if optimiser == "fixed-point":
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


def client_step(seed, state: ClientState, message: ServerMessage, model, x, y, config: PVIConfig,
                prior: NaturalGaussian | None = None,
                num_clients: int = 1) -> tuple[ClientState, ClientMessage]:
    """One client update (Algorithm 1, step 2).

    Returns the new client state (the new factor pending) and the reply carrying
    ``delta = rho * (t_new - t_old)``. ``prior`` and ``num_clients`` are needed by the BCM cavities
    only. Without deletion (streaming VB) the factor grows by ``q_new / q`` every visit.
    """
    state = sync_client(state, message.accepted_round)
    cavity = cavity_for(config, message.posterior, state.value, prior, num_clients)
    q_new = local_optimum(seed, model, x, y, cavity, message.posterior, config)
    if config.cavity == "no-deletion":
        change = G.sub(q_new, message.posterior)
    else:
        change = G.sub(G.sub(q_new, cavity), state.value)
    delta = G.scale(change, config.damping)
    pending = G.add(state.value, G.scale(delta, config.server_damping))
    return commit.propose(state, pending, message.server_round), ClientMessage(
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
    accepted_round = state.accepted_round
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
        accepted_round = commit.record_accepted(accepted_round, pid, reply.request_round)
        accepted.append(pid)
    new_state = state._replace(posterior=posterior, server_round=server_round,
                               accepted_round=accepted_round)
    return new_state, ServerInfo(tuple(accepted), tuple(rejected))


def free_energy_term(state: ClientState, posterior: NaturalGaussian, accepted_round: int, model,
                     x, y) -> tuple[ClientState, float]:
    """Client ``k``'s share of the global free energy at ``q``.

    ``F(q) = sum_k (E_q[log p(y_k | theta)] - E_q[eta_k . T(theta)]) + A(eta_q) - A(eta_0)``
    (Ashman et al. 2022, Section 2.2 and B.2: the sum of local free energies is the global free
    energy). The client computes its bracket; the server adds the log-normaliser difference.
    """
    from ..posterior import GaussianPosterior

    state = sync_client(state, accepted_round)
    term = model.expected_log_likelihood(GaussianPosterior(posterior), x, y)
    return state, term - G.expected_dot(state.value, posterior)


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


# ---------------------------------------------------------------------------- the bundle
def _init_server(setup) -> ServerState:
    return init_server(setup.prior, setup.num_clients)


def _init_client(setup, partition_id: int) -> ClientState:
    return init_client(setup.prior)


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    """Free-energy query to every client after a recorded update; otherwise the schedule's
    clients (asynchronous: the idle ones) get ``q``."""
    if state.phase == _PHASE_EVALUATE:
        return {pid: Request(EVALUATE, EvalMessage(state.posterior, int(state.accepted_round[pid])))
                for pid in range(setup.num_clients)}
    schedule = setup.config.schedule
    if schedule == "asynchronous":
        pids = sorted(rnd.idle)
    else:
        pids = select_clients(setup.run_seed, rnd.number, setup.num_clients, schedule)
    return {pid: Request(TRAIN, broadcast(state, pid)) for pid in pids}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    if request.action == EVALUATE:
        message = request.message
        state, term = free_energy_term(state, message.posterior, message.accepted_round,
                                       setup.model, data.x, data.y)
        return state, EvalReply(np.asarray([term], dtype=np.float64)), {}
    state, reply = client_step(seed, state, request.message, setup.model, data.x, data.y,
                               setup.config, setup.prior, setup.num_clients)
    return state, reply, {}


def _server_step(state: ServerState, replies, setup, rnd):
    config = setup.config
    if state.phase == _PHASE_EVALUATE:
        rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
        lml = None if rejected else log_marginal_likelihood(
            state, [float(r.term[0]) for _, r in sorted(replies, key=lambda r: r[0])])
        return state._replace(phase=_PHASE_TRAIN), StepInfo(
            updates=0, rejected=rejected, metrics={"log_marginal_likelihood": lml})
    state, info = server_step(state, replies, config.server_damping)
    metrics = {"log_marginal_likelihood": None}
    if config.optimise_prior:
        state, metrics["prior_scale"] = optimise_prior_scale(state)
    evaluate = rnd.evaluate and config.schedule != "asynchronous"  # async: nobody is free
    if evaluate:
        state = state._replace(phase=_PHASE_EVALUATE)
    return state, StepInfo(updates=1, accepted=info.accepted, rejected=info.rejected,
                           settled=not evaluate, metrics=metrics)


def _posterior(state: ServerState, setup):
    from ..posterior import GaussianPosterior

    return GaussianPosterior(state.posterior)


def _actions(setup) -> dict[str, ActionSpec]:
    prior = setup.prior
    return {TRAIN: ActionSpec("train", ServerMessage(prior, 0, 0), ClientMessage(prior, 0, 0)),
            EVALUATE: ActionSpec("evaluate", EvalMessage(prior, 0),
                                 EvalReply(np.zeros(1, np.float64)))}


def _client_state_template(setup) -> ClientState:
    return init_client(setup.prior)


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """Invariant: the damped delta keeps the posterior proper (checked again cumulatively as the
    round's deltas are applied, in :func:`server_step`)."""
    if action != TRAIN:
        return None
    return check_delta(state.posterior, G.scale(reply.delta, setup.config.server_damping))


def _mode(config: PVIConfig) -> str:
    return "apply-on-arrival" if config.schedule == "asynchronous" else "barrier"


def _corrupt(kind: str, reply, request: Request):
    """``negative-precision``: a delta that makes the posterior precision negative definite."""
    if kind == "negative-precision" and request.action == TRAIN:
        posterior = request.message.posterior
        return reply._replace(delta=NaturalGaussian(reply.delta.eta1, -2.0 * posterior.eta2))
    raise ValueError(f"PVI cannot make a {kind!r} fault")


def _prior_diag(config: PVIConfig, model) -> bool:
    return config.covariance == "diag" or (config.covariance == "auto" and model.mean_field_only)


BUNDLE = Bundle(
    name="pvi", config_class=PVIConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, mode=_mode, corrupt=_corrupt, prior_diag=_prior_diag)


# ---------------------------------------------------------------------------- presets
def _bcm(cavity):
    def preset(c):
        return c.replace(num_rounds=1).with_section(schedule="synchronous", damping=1.0,
                                                     server_damping=1.0, cavity=cavity)
    return preset


def _streaming(c):
    return c.replace(num_rounds=c.num_clients).with_section(
        schedule="sequential", damping=1.0, server_damping=1.0, cavity="no-deletion")


def _streaming_no_deletion(c):
    return c.with_section(schedule="sequential", damping=1.0, server_damping=1.0,
                          cavity="no-deletion")


def _global_vi(c):  # one client holding all rows: damping would only slow the fit down
    return c.replace(num_clients=1).with_section(schedule="synchronous", damping=1.0,
                                                 server_damping=1.0)


def _global_vi_federated(c):
    return c.with_section(schedule="synchronous", damping=1.0, server_damping=1.0,
                          local_optimiser="fixed-point", fixed_point_iterations=1)


PRESETS = {
    "pvi": (None, "PVI: clients send damped natural-parameter deltas of their factors t_k"),
    "global-vi": (_global_vi, "the same model on the pooled data (M = 1): the reference"),
    "global-vi-federated": (_global_vi_federated,
                            "global VI's dynamics federated: one natural-gradient step per "
                            "client per round (Section 2.5)"),
    "bcm-same": (_bcm("same-prior"), "Bayesian committee machine, same prior, one shot"),
    "bcm-split": (_bcm("split-prior"), "Bayesian committee machine, split prior p^(1/M)"),
    "vcl": (_streaming, "one sequential pass, each posterior the next prior"),
    "streaming-vb": (_streaming, "one sequential pass, each posterior the next prior"),
    "streaming-vb-no-deletion": (_streaming_no_deletion,
                                 "sequential passes without deleting old factors "
                                 "(over-confident)"),
}


def registrations():
    """``(name, bundle, preset, description)`` for PVI and its baselines (the registry calls it)."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
