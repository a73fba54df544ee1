"""Partitioned variational inference (PVI) as pure functions over NamedTuple states.

The server keeps ``q = p x prod_k t_k`` in natural parameters. A selected client ``k`` receives
``q``, forms its cavity ``q / t_k``, finds the local optimum ``q_k`` of the local free energy
against that cavity, and returns the damped natural-parameter change of its factor

    delta_k = rho * (q_k / q_cav - t_k)          (natural parameters)

The server multiplies ``q`` by every accepted ``delta_k``. Schedules: ``synchronous`` (all clients
each round) and ``sequential`` (one client per round, each pass in a seeded order).

Two protocols:

* **Server-held factors** (``damping = "auto"``, the default, for the synchronous and
  asynchronous schedules; or ``guard = true`` with a numeric damping, synchronous). The server
  keeps every client's factor ``t_k`` (it sees every delta anyway) and sends it with ``q``; the
  client returns the *undamped* change ``t_k' - t_k`` and keeps nothing, so a restarted device
  cannot fall out of step.

  Synchronous: the server picks the step ``s`` on the round's combined delta by a safeguarded
  rule on the global free energy (:mod:`fedbayes_flwr.algorithms.pvi.step`): it sends the
  candidate posteriors ``q + s * sum_k delta_k`` for the first step ``rho * rho_s`` (``1``
  exactly for ``auto``, so conjugate models stay exact in one round) and its halvings to every
  client in ONE exchange, and takes the largest step whose free energy has not fallen (up to a
  relative tolerance). Anderson acceleration adds its extrapolated point to the same exchange and
  is taken whenever it passes the same check, even if a plain step scores a higher free energy:
  on breast-cancer the free energy is dominated by the standard deviations, which settle in a
  few rounds, while the extrapolation is what moves the slow means. The exchange doubles as the
  free-energy evaluation the recorder reports. A round where no step keeps the free energy is
  rolled back (the *divergence guard*); every backtrack is recorded in the history row's
  ``diagnostics``.

  Asynchronous ``auto``: no client is free to evaluate candidates, so each reply is applied with
  a staleness-aware step (:func:`staleness_step`), checked for properness.
* **Client-held factors** (a numeric ``damping`` with ``guard = false``: the paper's protocol and
  the one-shot / streaming presets; the sequential schedule, where ``auto`` means damping 1;
  asynchronous PVI with a numeric damping). Damping ``rho`` is applied ONCE, by the client, to
  its delta; the server applies it as received. A client keeps ``t_k`` between rounds; its new
  factor stays *pending* until the server tells it (``accepted_round`` in the next message) that
  the delta was applied; a rejected delta is discarded, so client and server never disagree
  about ``t_k``. Each reply is checked for properness against the posterior it lands on. Why no
  free-energy rule for sequential PVI: its update maximises the client's *local* free energy,
  which can lower the global one before the fixed point (measured: by 7e-7 relative on the
  conjugate ``gaussian-mean``, where damping 1 is exact after one pass), so the rule would break
  sequential PVI's exactness.

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning": Algorithm 1 (client selection, local update, server update), eq. (2) (local free
energy), eq. (3) (factor update by division), Section 2.4 (schedules, damping) and Section 2.2
(the sum of local free energies is the global free energy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, MemoryEstimate, Rejection, Request, StepInfo
from fedbayes_flwr.algorithms.pvi import privacy
from fedbayes_flwr.algorithms.pvi.client import (
    candidate_terms,
    client_step,
    free_energy_term,
    init_client,
    undamped_change,
)
from fedbayes_flwr.algorithms.pvi.config import PVIConfig
from fedbayes_flwr.algorithms.pvi.messages import (
    PHASE_EVALUATE,
    PHASE_SEARCH,
    PHASE_TRAIN,
    CandidateMessage,
    CandidateReply,
    ClientMessage,
    ClientState,
    EvalMessage,
    EvalReply,
    NoState,
    ServerMessage,
    ServerState,
    StepMessage,
)
from fedbayes_flwr.algorithms.pvi.presets import PRESETS, with_dp_plan
from fedbayes_flwr.algorithms.pvi.server import (
    _stacked_zeros,
    broadcast,
    candidates,
    check_delta,
    collect_deltas,
    factor_of,
    init_server,
    log_marginal_likelihood,
    optimise_prior_scale,
    search_step,
    select_clients,
    server_step,
    staleness_step,
)
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.posterior import GaussianPosterior

if TYPE_CHECKING:
    pass

TRAIN, EVALUATE = "train", "evaluate"
STEP, CANDIDATES = "step", "candidates"  # the server-held-factor protocol's two actions


# ---------------------------------------------------------------------------- the bundle
def _monte_carlo(setup) -> bool:
    """Whether the model's expectations are Monte-Carlo estimates (BNNs), which sets what
    ``step-rule = auto`` and ``proximal = auto`` mean. A strategy reused without a model (e.g.
    ``PVIStrategy(prior, num_clients)`` in another Flower app) gets the settings of models with
    exact expectations: they keep conjugate models exact in one round."""
    return setup.model is not None and not setup.model.deterministic_expectations


def _init_server(setup) -> ServerState:
    return init_server(setup.prior, setup.num_clients, setup.config, _monte_carlo(setup))


def _init_client(setup, partition_id: int) -> ClientState | NoState:
    return NoState(np.zeros(0)) if setup.config.server_held else init_client(setup.prior)


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    """Free-energy query to every client after a recorded update; otherwise the schedule's
    clients (asynchronous: the idle ones) get ``q``."""
    if state.phase == PHASE_EVALUATE:
        return {pid: Request(EVALUATE, EvalMessage(state.posterior, int(state.accepted_round[pid])))
                for pid in range(setup.num_clients)}
    if state.phase == PHASE_SEARCH:
        posts = candidates(state, setup.config).posteriors
        message = CandidateMessage(posts.eta1, posts.eta2)
        return {pid: Request(CANDIDATES, message) for pid in range(setup.num_clients)}
    schedule = setup.config.schedule
    if schedule == "asynchronous":
        pids = sorted(rnd.idle)
    else:
        pids = select_clients(setup.run_seed, rnd.number, setup.num_clients, schedule)
    if setup.config.private:
        _check_budget(state, setup, pids)
    if setup.config.server_held:
        return {pid: Request(STEP, StepMessage(state.posterior, factor_of(state, pid),
                                               state.server_round + 1, float(state.proximal)))
                for pid in pids}
    return {pid: Request(TRAIN, broadcast(state, pid)) for pid in pids}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    if request.action == STEP:
        return state, undamped_change(seed, request.message, setup.model, data.x, data.y,
                                      setup.config, setup.prior, setup.num_clients), {}
    if request.action == CANDIDATES:
        return state, candidate_terms(request.message, setup.model, data.x, data.y), {}
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
    if config.server_held:
        if state.phase == PHASE_SEARCH:
            state, info = search_step(state, replies, config, setup.num_clients,
                                      not _monte_carlo(setup))
        else:
            state, info = collect_deltas(state, replies, config)
        if info.updates and config.optimise_prior:
            state, scale = optimise_prior_scale(state)
            info = info._replace(metrics={**info.metrics, "prior_scale": scale})
        return state, info
    if state.phase == PHASE_EVALUATE:
        rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
        lml = None if rejected else log_marginal_likelihood(
            state, [float(r.term[0]) for _, r in sorted(replies, key=lambda r: r[0])])
        return state._replace(phase=PHASE_TRAIN), StepInfo(
            updates=0, rejected=rejected, metrics={"log_marginal_likelihood": lml})
    state, info = server_step(state, replies, config.server_damping)
    metrics: dict = {"log_marginal_likelihood": None}
    if config.private:
        state = _account(state, replies, setup)
        metrics.update(_dp_metrics(state, setup))
    if config.optimise_prior:
        state, metrics["prior_scale"] = optimise_prior_scale(state)
    # async: nobody is free; DP: the free-energy query would release data without noise
    evaluate = rnd.evaluate and config.schedule != "asynchronous" and not config.private
    if evaluate:
        state = state._replace(phase=PHASE_EVALUATE)
    return state, StepInfo(updates=1, accepted=info.accepted, rejected=info.rejected,
                           settled=not evaluate, metrics=metrics)


def _account(state: ServerState, replies, setup) -> ServerState:
    """DP runs: count a round for every client asked to train (a rejected reply was computed
    too), and note the rows each reply reports (the sampling rate ``batch-size / n_k``)."""
    examples, rounds = state.dp_examples.copy(), state.dp_participations.copy()
    for pid, reply in replies:
        rounds[pid] += 1
        if not isinstance(reply, Rejection):
            examples[pid] = int(reply.num_examples)
    return state._replace(dp_examples=examples, dp_participations=rounds)


def _dp_metrics(state: ServerState, setup) -> dict:
    """``dp_epsilon`` (spent so far at ``dp_delta``, the worst client) for the history row."""
    config = setup.config
    eps = privacy.worst_spent(config, state.dp_examples, state.dp_participations,
                              setup.num_clients)
    return {"dp_epsilon": eps, "dp_delta": float(config.dp_delta)}


def _check_budget(state: ServerState, setup, pids) -> None:
    """Stop the run (:class:`RunStopped`, results kept) before a round would take a client
    past ``dp-epsilon`` (a given noise multiplier; a calibrated one stays within it for the
    planned ``dp-rounds``)."""
    config = setup.config
    over = privacy.over_target(config, state.dp_examples, state.dp_participations, pids,
                               setup.num_clients)
    if over is not None:
        pid, eps = over
        raise RunStopped(f"pvi.dp-epsilon: round {state.server_round + 1} would take partition "
                         f"{pid} to epsilon {eps:.4g} > target {config.dp_epsilon:g} (delta "
                         f"{config.dp_delta:g}); stopped before it")


def _posterior(state: ServerState, setup):
    return GaussianPosterior(state.posterior)


def _actions(setup) -> dict[str, ActionSpec]:
    prior = setup.prior
    count = setup.config.num_candidates
    stacked = _stacked_zeros(prior, count)
    return {TRAIN: ActionSpec("train", ServerMessage(prior, 0, 0), ClientMessage(prior, 0, 0)),
            EVALUATE: ActionSpec("evaluate", EvalMessage(prior, 0),
                                 EvalReply(np.zeros(1, np.float64))),
            STEP: ActionSpec("train", StepMessage(prior, prior, 0, 0.0),
                             ClientMessage(prior, 0, 0)),
            CANDIDATES: ActionSpec("evaluate", CandidateMessage(stacked.eta1, stacked.eta2),
                                   CandidateReply(np.zeros(count, np.float64)))}


def _client_state_template(setup) -> ClientState | NoState:
    return _init_client(setup, 0)


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """Invariant: the damped delta keeps the posterior proper (checked again cumulatively as the
    round's deltas are applied, in :func:`server_step`)."""
    config = setup.config
    if action == STEP:  # a genuine undamped change keeps q proper at the full step (q' = q_k)
        step = (staleness_step(state, reply.request_round)
                if config.schedule == "asynchronous" else 1.0)
        return check_delta(state.posterior, G.scale(reply.delta, step))
    if action != TRAIN:
        return None
    return check_delta(state.posterior, G.scale(reply.delta, config.server_damping))


def _mode(config: PVIConfig) -> str:
    return "apply-on-arrival" if config.schedule == "asynchronous" else "barrier"


def _corrupt(kind: str, reply, request: Request):
    """``negative-precision``: a delta that makes the posterior precision negative definite."""
    if kind == "negative-precision" and request.action in (TRAIN, STEP):
        posterior = request.message.posterior
        return reply._replace(delta=NaturalGaussian(reply.delta.eta1, -2.0 * posterior.eta2))
    raise ValueError(f"PVI cannot make a {kind!r} fault")


def _prior_diag(config: PVIConfig, model) -> bool:
    return config.covariance == "diag" or (config.covariance == "auto" and model.mean_field_only)


def _memory_estimate(setup) -> MemoryEstimate:
    """The Gaussians PVI holds: prior, posterior, every client's factor and pending delta (the
    server-held ones and the clients' own), the local solver's working copies (Cholesky factor,
    covariance, gradient, candidate), and with Anderson acceleration ``2 m`` factors per client:
    ``(3 K + 6 + 2 m K)`` copies of ``d^2`` (full covariance) or ``d`` (diagonal) float64s."""
    config, k = setup.config, setup.num_clients
    d = setup.model.param_dim(setup.num_features)
    diag = _prior_diag(config, setup.model)
    m = config.anderson_memory if config.acceleration == "anderson" else 0
    copies = 3 * k + 6 + 2 * m * k
    size = d if diag else d * d
    layout = "d" if diag else "d^2"
    formula = (f"{'diagonal' if diag else 'full'} covariance: (3 K + 6{' + 2 m K' if m else ''}) "
               f"x {layout} x 8 bytes, K = {k}, d = {d}{f', m = {m}' if m else ''}")
    alternative = ("use fewer clients or features" if diag else
                   f"use pvi.covariance=diag (about {copies * d * 8 / 2**20:.3g} MiB)")
    return MemoryEstimate(copies * size * 8, formula, alternative)


BUNDLE = Bundle(
    name="pvi", config_class=PVIConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, mode=_mode, corrupt=_corrupt, prior_diag=_prior_diag,
    memory_estimate=_memory_estimate)


def registrations():
    """``(name, bundle, preset, description)`` for PVI and its baselines (the registry calls it)."""
    return [(name, BUNDLE, with_dp_plan(preset), description)
            for name, (preset, description) in PRESETS.items()]
