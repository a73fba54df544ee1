"""Decentralized Metropolis-adjusted HMC over a peer graph, as one bundle (seed 004).

The agents are the partitions; the server only routes: every request carries an agent exactly
its graph neighbours' last broadcasts (:func:`fedbayes_flwr.algorithms.routing.route`, padded to
the largest degree with sender id -1), its row of the Metropolis-Hastings mixing matrix and the
shared step size. All the maths is in :mod:`fedbayes_flwr.dhmc` (agents) and
:mod:`fedbayes_flwr.gossip` (graph, weights).

**Exchanges of one iteration** (``s`` = ``dhmc.mixing-rounds``, ``D`` = the graph's diameter):

* ``s`` exchanges mixing ``[z, a]`` (proposal and energy tracker): each agent replies
  ``W_ii own + sum_j W_ij inbox_j``; after the last it takes the gradient at its mixed proposal
  and broadcasts the tracker increment ``b``;
* ``s`` exchanges mixing ``b`` (gradient tracking); after the last each agent computes its
  energy change and its own Metropolis decision;
* ``dhmc.decision = agree`` (default): ``D`` flooding exchanges in which each agent replies the
  AND of its and its neighbours' accept bits, so after ``D`` every agent holds the network AND
  and all take the same decision (a proposal is accepted when every agent's test accepts it);
  ``local`` (the paper): each agent applies its own decision at once (no extra exchange);
  disagreements are counted. Measured: with ``local`` one disagreement breaks the trackers'
  invariant and consensus (README), which is why ``agree`` is the default.

Then every agent applies the decision and starts the next iteration in the same reply. The
first exchange initialises the agents (``w0`` from the prior, the same at every agent: one
draw per chain from the run seed). Shared momentum and uniform: every agent draws them from
``(run seed, "dhmc.momentum", iteration)``.

**Warm-up** (``dhmc.warmup`` iterations): the server adapts the shared step size by dual
averaging on the agents' mean acceptance probability, then fixes it
(:func:`fedbayes_flwr.dhmc.dual_averaging_step`). The Metropolis test stays on
(``dhmc.warmup-metropolis``); the paper switches it off during this burn-in, which on
breast-cancer logistic regression let the step grow to 1.2 and the chains drift where almost
nothing is then accepted (acceptance 0.0007, R-hat 64). Samples are the agents' average iterate per
chain after the warm-up; ESS and R-hat are computed across chains, never across agents (their
copies are near-identical); every agent's iterates are saved as ``agent_samples``.

**Stopping**: ``dhmc.iterations > 0`` sampling iterations, else the pooled minimum ESS reaches
``dhmc.target-ess`` or ``dhmc.max-seconds`` pass. **Failures**: a missing or bad reply is
retried, then the run stops with the samples so far saved (an agent is never dropped: its data
would leave the target).

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1; Xiao & Boyd (2004), "Fast linear
iterations for distributed averaging" (Metropolis-Hastings weights); Lynch (1996),
"Distributed Algorithms", Section 4.1 (flooding: D rounds reach every node).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import dhmc as H
from .. import gaussian as G
from ..errors import ConfigError
from ..seeds import derive_seed, numpy_rng
from .base import ActionSpec, Bundle, Rejection, Request, StepInfo
from .routing import padded_inboxes

STEP = "train"
ULA = "ula"
ULA_DECAY, ULA_OFFSET, ULA_STEP = 0.55, 230.0, 1e-3
START, MIX_ZA, MIX_B, FLOOD = 0, 1, 2, 3
DECISIONS = ("agree", "local")
DEFAULT_EVAL_EVERY = 100
NO_CAP = 10**9


@dataclass(frozen=True)
class DHMCConfig:
    """Decentralized MH-HMC settings: the run-config section ``[tool.flwr.app.config.dhmc]``.

    Attributes
    ----------
    graph : str
        Peer graph (:func:`fedbayes_flwr.gossip.make_graph`): ``ring``, ``path``, ``torus``,
        ``torus:RxC``, ``erdos-renyi:P``, ``complete``, ``file:PATH`` or a JSON adjacency.
    step_size : float
        Initial shared step size ``epsilon`` (adapted during the warm-up when ``adapt``).
    warmup : int
        Iterations of step size adaptation, not kept.
    warmup_metropolis : bool
        Keep the Metropolis test on during the warm-up (default). False is the paper's MH
        burn-in (test off while the step adapts); measured to carry logistic chains away
        (README), so it is not the default.
    adapt : bool
        Adapt the step size during the warm-up.
    target_accept : float
        The warm-up's target mean acceptance probability.
    mixing_rounds : int
        ``s``: gossip rounds per phase.
    num_chains : int
        ``K`` independent chains carried by every message.
    iterations : int
        Sampling iterations after the warm-up (0: stop at ``target-ess``).
    target_ess : float
        Pooled minimum ESS over coordinates that ends a run without ``iterations``.
    max_seconds : float
        Wall-clock cap of such a run (0 = none).
    integrator : str
        ``leapfrog`` (velocity Verlet, reversible), ``euler`` (the paper's symplectic Euler) or
        ``ula`` (decentralized unadjusted Langevin, the paper's baseline: ``w_i <- (W^s w)_i -
        h_t m grad U_i(w_i) + sqrt(2 h_t m) xi_i`` with independent ``xi_i`` per agent, so the
        network average takes an exact Langevin step; ``h_t = step-size (230 / (230 + t))^0.55``
        as the reference code; no Metropolis test, no tracking).
    energy : str
        ``exact`` (default: the network sum of the local potential differences) or ``taylor``
        (the paper's second-order term: exact on Gaussians, but its O(epsilon^3) error biased
        logistic regression at the adapted step; README).
    decision : str
        ``agree`` (flooded AND of the agents' decisions) or ``local`` (each agent its own).
    """

    graph: str = "ring"
    step_size: float = 0.01
    warmup: int = 200
    warmup_metropolis: bool = True
    adapt: bool = True
    target_accept: float = 0.6
    mixing_rounds: int = 10
    num_chains: int = 16
    iterations: int = 0
    target_ess: float = 400.0
    max_seconds: float = 110.0
    integrator: str = "leapfrog"
    energy: str = "exact"
    decision: str = "agree"

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""
        from ..gossip import make_graph
        from ..models import Model, make_model, model_class

        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"dhmc.{key}: {msg}")

        need(self.step_size > 0, "step-size", f"must be > 0, got {self.step_size}")
        need(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}")
        need(0 < self.target_accept < 1, "target-accept",
             f"must be in (0, 1), got {self.target_accept}")
        need(self.mixing_rounds >= 1, "mixing-rounds", f"must be >= 1, got {self.mixing_rounds}")
        need(self.num_chains >= 2, "num-chains",
             f"must be >= 2 (ESS and R-hat across chains), got {self.num_chains}")
        need(self.iterations >= 0, "iterations", f"must be >= 0, got {self.iterations}")
        need(self.target_ess > 0, "target-ess", f"must be > 0, got {self.target_ess}")
        need(self.max_seconds >= 0, "max-seconds", f"must be >= 0, got {self.max_seconds}")
        need(self.integrator in (*H.INTEGRATORS, ULA), "integrator",
             f"unknown integrator {self.integrator!r}; choose one of "
             f"{', '.join((*H.INTEGRATORS, ULA))}")
        need(self.energy in H.ENERGIES, "energy",
             f"unknown energy {self.energy!r}; choose one of {', '.join(H.ENERGIES)}")
        need(self.decision in DECISIONS, "decision",
             f"unknown decision {self.decision!r}; choose one of {', '.join(DECISIONS)}")
        try:
            make_graph(self.graph, run.num_clients, run.seed)
        except ValueError as err:
            raise ConfigError(f"dhmc.graph: {err}") from None
        if getattr(model_class(run.model), "structured", False):
            return
        model = make_model(run.model, run.noise_scale)
        if type(model).pdmp_potential is Model.pdmp_potential:
            raise ConfigError(f"model: decentralized HMC needs the model's numpy potential; "
                              f"{run.model!r} has none (gaussian-mean, linear-regression, "
                              f"logistic-regression, ar1-student-t do)")


class Topology(NamedTuple):
    """The graph, its mixing matrix, padded neighbour lists, and its diameter."""

    neighbours: dict
    weights: np.ndarray
    senders: np.ndarray
    diameter: int


def topology(setup) -> Topology:
    """The run's graph (:func:`fedbayes_flwr.gossip.make_graph`) and Metropolis weights."""
    return _topology(setup.config.graph, setup.num_clients, setup.run_seed)


@functools.lru_cache(maxsize=32)
def _topology(spec: str, num_agents: int, seed: int) -> Topology:
    from scipy.sparse.csgraph import shortest_path

    from ..gossip import make_graph, metropolis_weights

    graph = make_graph(spec, num_agents, seed)
    w = metropolis_weights(graph)
    nbrs = graph.neighbours
    width = max(1, max(len(v) for v in nbrs.values()))
    senders = np.full((num_agents, width), -1, np.int64)
    for agent, others in nbrs.items():
        senders[agent, :len(others)] = others
    dist = shortest_path(graph.adjacency.astype(float), unweighted=True)
    return Topology(nbrs, w, senders, int(dist.max()) if dist.size else 0)


class ServerState(NamedTuple):
    """Routing state, the shared step size, and what the run recorded."""

    iteration: int
    phase: int
    round: int
    outbox: np.ndarray
    epsilon: float
    adaptation: H.DualAveraging
    kept: tuple
    accepts: tuple
    disagreements: tuple
    last_w: np.ndarray
    exchanges: int
    grad_evals: int
    started: float


class AgentState(NamedTuple):
    """One agent: the :class:`fedbayes_flwr.dhmc.AgentState` arrays, its current broadcast
    ``own (K, F)``, the mixed proposal, energy tracker and gradient tracker of the iteration in
    progress, its decision bits, and the step size it began the iteration with."""

    agent: H.AgentState
    own: np.ndarray
    z_mixed: np.ndarray
    aleph_mixed: np.ndarray
    y_mixed: np.ndarray
    y_kept: np.ndarray
    decided: np.ndarray
    epsilon: np.ndarray


class Down(NamedTuple):
    """``inbox (width, K, F)`` from the ``senders`` (``-1``: padding); ``weights`` =
    ``(W_ii, W_i,senders...)``; phase, round and iteration; the step size for the next
    iteration to begin; whether the Metropolis test is on."""

    inbox: np.ndarray
    senders: np.ndarray
    weights: np.ndarray
    phase: int
    round: int
    iteration: int
    epsilon: float
    metropolis: int


class Up(NamedTuple):
    """The new broadcast ``(K, F)``, the agent's iterate ``w (K, d)``, its acceptance
    probabilities and own decisions of the iteration it just tested, its gradient evaluations."""

    out: np.ndarray
    w: np.ndarray
    accept_prob: np.ndarray
    decided: np.ndarray
    grad_evals: int
    iteration: int


# ---------------------------------------------------------------------------- helpers
def _dims(setup) -> tuple[int, int, int]:
    """``(K, d, F)``: chains, parameters, broadcast width (``[z, a]``: ``d + 1`` values;
    ``[b, y]``: ``2 d``)."""
    d = setup.prior.dim
    return setup.config.num_chains, d, 2 * d + 1


def local_potential(setup, data):
    """``U_i``: the agent's likelihood potential plus ``1/m`` of the prior's (cached by the
    rows' content)."""
    from ..pdmp.potentials import cached, from_natural

    def build():
        return H.LocalPotential(setup.model.pdmp_potential(data.x, data.y),
                                from_natural(setup.prior), setup.num_clients)
    return cached(("dhmc", id(setup.model), setup.num_clients, setup.prior.dim), data, build)


def initial_position(setup) -> np.ndarray:
    """``w0 (K, d)``: one prior draw per chain, the same at every agent."""
    rng = numpy_rng(derive_seed(setup.run_seed, "dhmc.init", 0, -1))
    mean, cov = G.to_moments(setup.prior)
    cov = np.diag(cov) if setup.prior.is_diag else cov
    return rng.multivariate_normal(mean, cov, size=setup.config.num_chains)


def shared(setup, iteration: int):
    """The iteration's momentum and ``log u``, identical at every agent."""
    rng = numpy_rng(derive_seed(setup.run_seed, "dhmc.momentum", iteration, -1))
    return H.shared_draws(rng, setup.config.num_chains, setup.prior.dim)


def _mix(own: np.ndarray, msg: Down) -> np.ndarray:
    out = msg.weights[0] * own
    for j, sender in enumerate(msg.senders):
        if sender >= 0:
            out = out + msg.weights[j + 1] * msg.inbox[j]
    return out


def _pad(values: np.ndarray, width: int) -> np.ndarray:
    values = values.reshape(values.shape[0], -1)
    out = np.zeros((values.shape[0], width))
    out[:, :values.shape[1]] = values
    return out


def _begin(st: AgentState, pot, setup, iteration: int, epsilon: float) -> AgentState:
    c = setup.config
    p, _ = shared(setup, iteration)
    agent, z, a = H.begin(st.agent, pot, p, epsilon, setup.num_clients, c.integrator, c.energy)
    return st._replace(agent=agent, own=_pad(np.concatenate([z, a[:, None]], axis=1),
                                             2 * z.shape[1] + 1),
                       epsilon=np.array([epsilon]))


def _apply_and_begin(st: AgentState, pot, setup, msg: Down) -> AgentState:
    agent = H.apply(st.agent, st.z_mixed, st.aleph_mixed, st.y_mixed, st.y_kept,
                    st.decided > 0.5)
    return _begin(st._replace(agent=agent), pot, setup, msg.iteration + 1, msg.epsilon)


# ---------------------------------------------------------------------------- bundle functions
def _init_server(setup) -> ServerState:
    k, d, f = _dims(setup)
    eps = setup.config.step_size
    return ServerState(0, START, 0, np.zeros((setup.num_clients, k, f)), eps,
                       H.dual_averaging_init(eps), (), (), (), np.zeros((setup.num_clients, k, d)),
                       0, 0, time.time())


def _client_state_template(setup) -> AgentState:
    k, d, f = _dims(setup)
    zk, zkd = np.zeros(k), np.zeros((k, d))
    agent = H.AgentState(zkd, zkd, zkd, zk, zk, zkd, zkd, zk, zkd)
    return AgentState(agent, np.zeros((k, f)), zkd, zk, zkd, zkd, zk, np.zeros(1))


def _init_client(setup, partition_id: int) -> AgentState:
    return _client_state_template(setup)


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    topo = topology(setup)
    c = setup.config
    metropolis = int(state.iteration >= c.warmup or c.warmup_metropolis)
    routed = padded_inboxes(state.outbox, topo.neighbours, topo.weights)
    return {agent: Request(STEP, Down(inbox, senders, weights, state.phase, state.round,
                                      state.iteration, float(state.epsilon), metropolis))
            for agent, (inbox, senders, weights) in routed.items()}


def _client_step(seed, st: AgentState, request: Request, data, setup):
    msg, c = request.message, setup.config
    pot = local_potential(setup, data)
    k, d, f = _dims(setup)
    prob, evals, decided = np.zeros(k), 0, np.zeros(k)
    if c.integrator == ULA:
        return _ula_step(seed, st, msg, pot, setup)
    if msg.phase == START:
        st = st._replace(agent=H.init_agent(pot, initial_position(setup)))
        st = _begin(st, pot, setup, msg.iteration, msg.epsilon)
        evals = 1 + (c.energy == "exact")
    elif msg.phase == MIX_ZA:
        st = st._replace(own=_mix(st.own, msg))
        if msg.round == c.mixing_rounds:  # z' and aleph' final: track the gradient at z'
            z, a = st.own[:, :d], st.own[:, d]
            agent, b = H.track(st.agent, pot, z)
            st = st._replace(agent=agent, z_mixed=z, aleph_mixed=a,
                             own=np.concatenate([b, agent.y, np.zeros((k, 1))], axis=1))
            evals = 1
    elif msg.phase == MIX_B:
        st = st._replace(own=_mix(st.own, msg))
        if msg.round == c.mixing_rounds:  # y' final: this agent's Metropolis decision
            y, y_kept = st.own[:, :d], st.own[:, d:2 * d]
            _, log_u = shared(setup, msg.iteration)
            out = H.decide(st.agent, st.aleph_mixed, y, log_u, float(st.epsilon[0]),
                           setup.num_clients, c.integrator, bool(msg.metropolis))
            prob, decided = out.accept_prob, out.accepted.astype(np.float64)
            st = st._replace(y_mixed=y, y_kept=y_kept, decided=decided, own=_pad(decided, f))
            if c.decision == "local" or topology(setup).diameter == 0:
                st = _apply_and_begin(st, pot, setup, msg)
                evals = c.energy == "exact"
    elif msg.phase == FLOOD:  # the AND of the neighbours' bits: after D rounds, everyone's
        bits = st.own[:, 0].copy()
        for j, sender in enumerate(msg.senders):
            if sender >= 0:
                bits = np.minimum(bits, msg.inbox[j][:, 0])
        st = st._replace(own=_pad(bits, f), decided=bits)
        decided = bits
        if msg.round == topology(setup).diameter:
            st = _apply_and_begin(st, pot, setup, msg)
            evals = c.energy == "exact"
    return st, Up(st.own, st.agent.w, prob, decided, int(evals), msg.iteration), {}


def ula_step_size(config: DHMCConfig, iteration: int) -> float:
    """``h_t = step-size (230 / (230 + t))^0.55`` (the reference code's decay)."""
    return config.step_size * (ULA_OFFSET / (ULA_OFFSET + iteration)) ** ULA_DECAY


def _ula_step(seed, st: AgentState, msg: Down, pot, setup):
    """Decentralized ULA: broadcast ``w``; after ``s`` mixing rounds take the Langevin step."""
    c = setup.config
    k, d, f = _dims(setup)
    m = setup.num_clients
    evals = 0
    if msg.phase == START:
        w = initial_position(setup)
        st = st._replace(agent=st.agent._replace(w=w), own=_pad(w, f))
    else:
        st = st._replace(own=_mix(st.own, msg))
        if msg.round == c.mixing_rounds:
            h = ula_step_size(c, msg.iteration)
            xi = numpy_rng(seed).standard_normal((k, d))
            w = (st.own[:, :d] - h * m * pot.grad(st.agent.w)
                 + np.sqrt(2.0 * h * m) * xi)
            st = st._replace(agent=st.agent._replace(w=w), own=_pad(w, f))
            evals = 1
    return st, Up(st.own, st.agent.w, np.zeros(k), np.ones(k), evals, msg.iteration), {}


def _next_phase(state: ServerState, setup) -> tuple[int, int, bool]:
    """``(phase, round, iteration complete)`` after the exchange ``state`` describes."""
    c = setup.config
    if c.integrator == ULA:
        if state.phase == START:
            return MIX_ZA, 1, False
        done = state.round == c.mixing_rounds
        return MIX_ZA, 1 if done else state.round + 1, done
    flood = c.decision == "agree" and topology(setup).diameter > 0
    if state.phase == START:
        return MIX_ZA, 1, False
    if state.phase == MIX_ZA:
        return (MIX_ZA, state.round + 1, False) if state.round < c.mixing_rounds else (
            MIX_B, 1, False)
    if state.phase == MIX_B:
        if state.round < c.mixing_rounds:
            return MIX_B, state.round + 1, False
        return (FLOOD, 1, False) if flood else (MIX_ZA, 1, True)
    if state.round < topology(setup).diameter:
        return FLOOD, state.round + 1, False
    return MIX_ZA, 1, True


def _server_step(state: ServerState, replies, setup, rnd):
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    if rejected:  # retry-stop: the engines stop before this (an agent is never dropped)
        raise RuntimeError(f"dhmc: {len(rejected)} agent replies missing")
    c = setup.config
    good = sorted(replies, key=lambda item: item[0])
    outbox = np.stack([r.out for _, r in good])
    evals = state.grad_evals + sum(int(r.grad_evals) for _, r in good)
    eps, adaptation = state.epsilon, state.adaptation
    accepts, disagreements = state.accepts, state.disagreements
    decided_phase = state.phase == MIX_B and state.round == c.mixing_rounds
    if decided_phase:
        own = np.stack([r.decided for _, r in good]) > 0.5  # (m, K) each agent's own test
        if state.iteration < c.warmup:
            if c.adapt:
                probs = np.stack([r.accept_prob for _, r in good])  # (m, K)
                # agreed decisions accept only what every agent accepts: adapt on the minimum
                prob = float(np.mean(probs.min(axis=0) if c.decision == "agree" else probs))
                adaptation = H.dual_averaging_step(adaptation, prob, c.target_accept)
                last = state.iteration == c.warmup - 1
                eps = float(np.exp(adaptation.log_eps_bar if last else adaptation.log_eps))
        else:
            disagreements = disagreements + (float(np.mean(own.any(0) & ~own.all(0))),)
    phase, rnd_next, complete = _next_phase(state, setup)
    kept, last_w = state.kept, state.last_w
    updates = 0
    if complete:
        last_w = np.stack([r.w for _, r in good])  # (m, K, d) after the decision
        final = np.stack([r.decided for _, r in good]) > 0.5
        if state.iteration >= c.warmup:
            kept = kept + (last_w,)
            accepts = accepts + (float(final.mean()),)
        updates = 1
    new = ServerState(state.iteration + complete, phase, rnd_next, outbox, eps, adaptation, kept,
                      accepts, disagreements, last_w, state.exchanges + 1, evals, state.started)
    info = StepInfo(updates=updates, accepted=tuple(pid for pid, _ in good))
    if complete and rnd.evaluate:
        info = info._replace(metrics=_metrics(new, setup))
    return new, info


def agent_samples(state: ServerState, setup) -> np.ndarray:
    """``(m, K, T, d)``: every agent's iterates after the warm-up (the last iterate if none)."""
    if not state.kept:
        return state.last_w[:, :, None, :]
    return np.stack(state.kept, axis=2)


def _metrics(state: ServerState, setup) -> dict:
    samples = agent_samples(state, setup)
    pooled = samples.mean(axis=0).reshape(-1, samples.shape[-1])
    var = pooled.var(axis=0) if pooled.shape[0] > 1 else None
    consensus = (float(np.mean(np.var(samples, axis=0) / np.where(var > 0, var, 1.0)))
                 if var is not None else float("nan"))
    ula = setup.config.integrator == ULA  # no Metropolis test: no acceptance rate
    return {"iterations": int(state.iteration), "step_size": float(state.epsilon),
            "acceptance_rate": (float(np.mean(state.accepts)) if state.accepts and not ula
                                else float("nan")),
            "disagreement_rate": (float(np.mean(state.disagreements))
                                  if state.disagreements else 0.0),
            "consensus_error": consensus, "exchanges": int(state.exchanges),
            "grad_evals": int(state.grad_evals),
            "wall_s": round(time.time() - state.started, 3)}


def _posterior(state: ServerState, setup):
    from ..posterior import TracePosterior

    samples = agent_samples(state, setup)
    return TracePosterior(samples.mean(axis=0), extras={"agent_samples": samples},
                          counts={"grad_evals": float(state.grad_evals),
                                  "exchanges": float(state.exchanges)})


def _done(state: ServerState, setup) -> bool:
    c = setup.config
    if c.iterations > 0:
        return len(state.kept) >= c.iterations
    if c.max_seconds and time.time() - state.started > c.max_seconds:
        return True
    if len(state.kept) < 20:
        return False
    from ..posterior import SamplePosterior

    return bool(np.min(SamplePosterior(agent_samples(state, setup).mean(axis=0)).ess())
                >= c.target_ess)


def _actions(setup) -> dict[str, ActionSpec]:
    k, d, f = _dims(setup)
    width = topology(setup).senders.shape[1]
    down = Down(np.zeros((width, k, f)), np.zeros(width, np.int64), np.zeros(width + 1), 0, 0, 0,
                0.0, 0)
    up = Up(np.zeros((k, f)), np.zeros((k, d)), np.zeros(k), np.zeros(k), 0, 0)
    return {STEP: ActionSpec("train", down, up)}


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    if reply.iteration != state.iteration:
        return "iteration", f"answers iteration {reply.iteration}, expected {state.iteration}"
    if reply.grad_evals < 0:
        return "grad_evals", f"must be >= 0, got {reply.grad_evals}"
    if np.any((reply.accept_prob < 0) | (reply.accept_prob > 1)):
        return "accept_prob", "must be in [0, 1]"
    return None


def _corrupt(kind: str, reply, request: Request):
    raise ValueError(f"dhmc cannot make a {kind!r} fault")


def _prior_diag(config: DHMCConfig, model) -> bool:
    return True


BUNDLE = Bundle(
    name="dhmc", config_class=DHMCConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, done=_done, failure_policy="retry-stop", corrupt=_corrupt,
    prior_diag=_prior_diag)


def _preset(**section):
    def preset(c):
        changes = {}
        if c.num_rounds == 10:  # the common default: the run's own length, or no cap (ESS)
            fixed = c.section.iterations
            changes["num_rounds"] = c.section.warmup + fixed if fixed > 0 else NO_CAP
        if c.eval_every == 1:
            changes["eval_every"] = DEFAULT_EVAL_EVERY
        return c.replace(**changes).with_section(**section)
    return preset


def _ula_preset():
    inner = _preset(integrator=ULA, adapt=False)

    def preset(c):
        if c.section.step_size == DHMCConfig.step_size:  # not set: ULA's own first step
            c = c.with_section(step_size=ULA_STEP)
        return inner(c)
    return preset


def _one_agent():
    inner = _preset(graph="complete", mixing_rounds=1)

    def preset(c):
        return inner(c.replace(num_clients=1))
    return preset


PRESETS = {
    "dhmc": (_preset(), "decentralized Metropolis-adjusted HMC: agents on a peer graph, gossip "
                        "mixing, gradient tracking, one leapfrog step per iteration"),
    "centralized-hmc": (_one_agent(), "HMC with one leapfrog step on the pooled data (one agent): "
                                      "the decentralized sampler's reference at equal step"),
    "decentralized-ula": (_ula_preset(),
                          "decentralized unadjusted Langevin over the same graph (no test, "
                          "decaying steps from dhmc.step-size): the paper's baseline"),
    "dmala": (_preset(integrator="euler", decision="local"),
              "the paper's decentralized MALA: one symplectic-Euler step (not reversible), each "
              "agent its own decision (a measured baseline)"),
}


def registrations():
    """``(name, bundle, preset, description)`` for decentralized HMC."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
