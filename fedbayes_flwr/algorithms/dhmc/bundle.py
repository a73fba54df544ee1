"""Decentralized Metropolis-adjusted HMC over a peer graph, as one bundle (seed 004).

The agents are the partitions; the server only routes: every request carries an agent exactly
its graph neighbours' last broadcasts (:func:`fedbayes_flwr.algorithms.decentralized.routing.route`, padded to
the largest degree with sender id -1), its row of the Metropolis-Hastings mixing matrix and the
shared step size. All the maths is in :mod:`fedbayes_flwr.algorithms.dhmc.agents` (agents) and
:mod:`fedbayes_flwr.algorithms.decentralized.graphs` (graph, weights).

**Exchanges of one iteration** (``s`` = ``dhmc.mixing-rounds``, or the value of
``dhmc.mixing-schedule`` at this iteration; ``D`` = the graph's diameter):

* ``s`` exchanges mixing ``[z, a]`` (proposal and energy tracker): each agent replies
  ``W_ii own + sum_j W_ij inbox_j``; after the last it takes the gradient at its mixed proposal
  and broadcasts the tracker increment ``b``;
* ``s`` exchanges mixing ``[b, y]`` (gradient tracking: the proposal's tracker and the kept
  positions' one); after the last each agent computes its energy change and its own
  Metropolis decision;
* ``dhmc.decision = agree`` (default): ``D`` flooding exchanges in which each agent replies the
  AND of its and its neighbours' accept bits, so after ``D`` every agent holds the network AND
  and all take the same decision (a proposal is accepted when every agent's test accepts it);
  ``local`` (the paper): each agent applies its own decision at once (no extra exchange);
  disagreements are counted.

So ``2 s L + D`` exchanges per iteration (``2 s L`` with ``local``). A rejection costs no
exchange: the rejecting agent keeps the mixed tracker of its position and books its
increment's remainder as a pending correction carried by its next ``b``
(:func:`fedbayes_flwr.algorithms.dhmc.agents.apply`), so the trackers describe the current
positions after any pattern of decisions (issue 27; recomputing them instead would cost ``s``
more exchanges per iteration).

With ``dhmc.leapfrog-steps = L > 1`` the two mixing phases repeat at each of the trajectory's
``L`` positions (:func:`fedbayes_flwr.algorithms.dhmc.agents.advance` between them) before the decision.
Then every agent applies the decision and starts the next iteration in the same reply. The
first exchange initialises the agents (``w0`` from the prior, the same at every agent: one
draw per chain from the run seed). Shared momentum and uniform: every agent draws them from
``(run seed, "dhmc.momentum", iteration)``.

**Warm-up** (``dhmc.warmup`` iterations): the server adapts the shared step size by dual
averaging on the agents' mean acceptance probability, then fixes it
(:func:`fedbayes_flwr.algorithms.dhmc.agents.dual_averaging_step`). The Metropolis test stays on
(``dhmc.warmup-metropolis``); the paper switches it off during this burn-in, which on
breast-cancer logistic regression let the step grow to 1.2 and the chains drift where almost
nothing is then accepted (acceptance 0.0007, R-hat 64). Samples are the agents' average iterate per
chain after the warm-up; ESS and R-hat are computed across chains, never across agents (their
copies are near-identical); every agent's iterates are saved as ``agent_samples``.

**Mass matrix** (``dhmc.mass-matrix``, :mod:`fedbayes_flwr.algorithms.dhmc.mass`): in the warm-up's
slow windows every agent adds its iterates to its statistics; the iteration after a window
carries them in an extra block of every broadcast (mixed by the same ``W`` as the proposals),
the flooding phase keeps the lowest-numbered agent's mixed block (so ``diagonal`` and
``dense`` need ``decision = agree``), and at the end of that iteration every agent computes the
same inverse mass from the same numbers and uses it from the next iteration on (momentum
``N(0, M)``, position step ``epsilon M^{-1} p``, kinetic energy ``p^T M^{-1} p / 2``); the
server restarts the step size's dual averaging. No extra exchange; ``none`` sends no block.

**Stopping**: ``dhmc.iterations > 0`` sampling iterations, else the pooled minimum ESS reaches
``dhmc.target-ess`` or ``dhmc.max-seconds`` pass. **Failures**: a missing or bad reply is
retried, then (``dhmc.on-dropout = stop``, the default) the run stops with the samples so far
saved: a dropped agent's data would leave the target. With ``on-dropout = continue`` the agents
that still fail after the retries are dropped and the run goes on over the remaining graph,
if it is connected (else it stops, naming the pieces): the Metropolis-Hastings weights and the
diameter are those of the remaining graph, every survivor restarts the interrupted iteration from
the survivors' average iterate with its trackers re-initialised (``y = g_last = grad U_i``,
``aleph = 0``) and the prior split over the survivors (``U_i = -log p(D_i | w) - log p_0 / m'``),
so the chains then sample ``p_0(w) prod_{i alive} p(D_i | w)``: **the target excludes the dropped
agents' data** from that iteration on. Their rows of ``agent_samples`` are NaN from then on;
the pooled samples average the survivors; ``dropped_at`` (iteration, or -1) is saved.

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

from fedbayes_flwr.algorithms import bounds
from fedbayes_flwr.algorithms.base import (
    ActionSpec,
    Bundle,
    MemoryEstimate,
    Rejection,
    Request,
    StepInfo,
    auto_or_number,
)
from fedbayes_flwr.algorithms.decentralized.graphs import induced, make_graph
from fedbayes_flwr.algorithms.decentralized.mixing import (
    metropolis_weights,
    parse_schedule,
    rounds_for,
    scheduled_rounds,
)
from fedbayes_flwr.algorithms.decentralized.routing import padded_inboxes
from fedbayes_flwr.algorithms.dhmc import agents as H
from fedbayes_flwr.algorithms.dhmc import mass as MM
from fedbayes_flwr.errors import ConfigError, RunStopped
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import SamplePosterior, TracePosterior
from fedbayes_flwr.inference.potentials import cached, from_natural
from fedbayes_flwr.models import make_model, model_spec
from fedbayes_flwr.seeds import derive_seed, numpy_rng

STEP = "train"
ULA = "ula"
ULA_DECAY, ULA_OFFSET, ULA_STEP = 0.55, 230.0, 1e-3
START, MIX_ZA, MIX_B, FLOOD = 0, 1, 2, 3
DECISIONS = ("agree", "local")
DROPOUTS = ("stop", "continue")
DEFAULT_EVAL_EVERY = 100
NO_CAP = 10**9
AUTO = "auto"
AUTO_TOLERANCE = 0.01  # mixing-rounds auto: W^s keeps at most 1% of a disagreement


@dataclass(frozen=True)
class DHMCConfig:
    """Decentralized MH-HMC settings: the run-config section ``[tool.flwr.app.config.dhmc]``.

    Attributes
    ----------
    graph : str
        Peer graph (:func:`fedbayes_flwr.algorithms.decentralized.graphs.make_graph`): ``ring``,
        ``path``, ``torus``,
        ``torus:RxC``, ``erdos-renyi:P``, ``complete``, ``file:PATH`` or a JSON adjacency.
    step_size : float
        Initial shared step size ``epsilon`` (adapted during the warm-up when ``adapt``).
    warmup : int
        Iterations of step size adaptation, not kept.
    warmup_metropolis : bool
        Keep the Metropolis test on during the warm-up (default). False is the paper's MH
        burn-in (test off while the step adapts); measured to carry logistic chains away
        (docs/families/dhmc.md), so it is not the default.
    adapt : bool
        Adapt the step size during the warm-up.
    target_accept : float
        The warm-up's target mean acceptance probability.
    mixing_rounds : int or "auto"
        ``s``: gossip rounds per phase. ``auto`` (default): the least ``s`` with
        ``(1 - gap)^s <= 0.01`` for the graph's spectral gap, i.e. ``W^s`` keeps at most 1% of a
        disagreement between agents (:func:`fedbayes_flwr.algorithms.decentralized.mixing.rounds_for`: 1
        on a complete
        graph, 8 on a ring of 5, 22 on a ring of 8, 34 on a path of 5). A fixed 10 left the
        agents' energy changes 26% apart on a path of 5 with digit-split data, and agreed
        decisions then accepted 11% of moves (docs/families/dhmc.md).
    num_chains : int
        ``K`` independent chains carried by every message.
    iterations : int
        Sampling iterations after the warm-up (0: stop at ``target-ess``).
    target_ess : float
        Pooled minimum ESS over coordinates that ends a run without ``iterations``.
    max_seconds : float
        Wall-clock cap of such a run (0 = none): the run's ``max-seconds`` unless that is set,
        so a run that stops there says ``time-limit``, not ``done``.
    integrator : str
        ``leapfrog`` (velocity Verlet, reversible), ``euler`` (the paper's symplectic Euler) or
        ``ula`` (decentralized unadjusted Langevin, the paper's baseline: ``w_i <- (W^s w)_i -
        h_t m grad U_i(w_i) + sqrt(2 h_t m) xi_i`` with independent ``xi_i`` per agent, so the
        network average takes an exact Langevin step; ``h_t = step-size (230 / (230 + t))^0.55``
        as the reference code; no Metropolis test, no tracking).
    leapfrog_steps : int
        ``L``: leapfrog steps per proposal (default 1, the paper's). ``L > 1`` repeats the
        mixing and tracking phases at every position (``2 s L`` exchanges per iteration) and
        needs ``integrator = leapfrog`` and ``energy = exact``.
    energy : str
        ``exact`` (default: the network sum of the local potential differences) or ``taylor``
        (the paper's second-order term: exact on Gaussians, but its O(epsilon^3) error biased
        logistic regression at the adapted step; docs/families/dhmc.md).
    decision : str
        ``agree`` (flooded AND of the agents' decisions) or ``local`` (each agent its own).
    mixing_schedule : str
        Empty (default: ``mixing-rounds`` throughout) or a capped schedule of rounds per phase
        by iteration (warm-up included), ``"R1:T1,R2:T2,...,RL"``
        (:func:`fedbayes_flwr.algorithms.decentralized.mixing.parse_schedule`); the reference code's 1,
        5, 10 rounds at
        milestones are e.g. ``"1:100,5:200,10"``.
    on_dropout : str
        ``stop`` (default: the run ends with a clear error and the samples so far saved) or
        ``continue`` (drop the agent and go on over the remaining connected graph; the target
        then excludes its data: module docstring).
    mass_matrix : str
        ``none`` (unit mass, the paper's), ``diagonal``, ``dense`` or ``auto``: a mass matrix
        adapted in Stan-style warm-up windows from the agents' draws, agreed by gossip and a
        flood so every agent holds the same one, then fixed
        (:mod:`fedbayes_flwr.algorithms.dhmc.mass`; ``auto``:
        :func:`fedbayes_flwr.algorithms.dhmc.mass.resolve`). ``diagonal`` and ``dense`` need
        ``decision = agree``.
    """

    graph: str = "ring"
    step_size: float = 0.01
    warmup: int = 200
    warmup_metropolis: bool = True
    adapt: bool = True
    target_accept: float = 0.6
    mixing_rounds: int | str = "auto"
    num_chains: int = 16
    iterations: int = 0
    target_ess: float = 400.0
    max_seconds: float = 110.0
    integrator: str = "leapfrog"
    leapfrog_steps: int = 1
    energy: str = "exact"
    decision: str = "agree"
    mixing_schedule: str = ""
    on_dropout: str = "stop"
    mass_matrix: str = "auto"

    def __post_init__(self):  # TOML / CLI give "auto" or a number (maybe as text)
        object.__setattr__(self, "mixing_rounds", auto_or_number(self.mixing_rounds, int))

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""

        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"dhmc.{key}: {msg}")

        need(self.step_size > 0, "step-size", f"must be > 0, got {self.step_size}")
        need(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}")
        need(0 < self.target_accept < 1, "target-accept",
             f"must be in (0, 1), got {self.target_accept}")
        need(self.mixing_rounds == AUTO or (isinstance(self.mixing_rounds, int)
                                            and self.mixing_rounds >= 1),
             "mixing-rounds", f"must be an integer >= 1 or 'auto', got {self.mixing_rounds!r}")
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
        need(self.leapfrog_steps >= 1, "leapfrog-steps",
             f"must be >= 1, got {self.leapfrog_steps}")
        need(self.leapfrog_steps == 1 or (self.integrator == "leapfrog"
                                          and self.energy == "exact"), "leapfrog-steps",
             f"{self.leapfrog_steps} steps need integrator 'leapfrog' and energy 'exact' "
             f"(got {self.integrator!r}, {self.energy!r})")
        need(self.mass_matrix in MM.KINDS, "mass-matrix",
             f"unknown value {self.mass_matrix!r}; choose one of {', '.join(MM.KINDS)}")
        need(self.mass_matrix in ("none", AUTO) or (self.decision == "agree"
                                                   and self.integrator != ULA), "mass-matrix",
             f"{self.mass_matrix!r} needs decision 'agree' (its flooding phase agrees the "
             f"matrix) and a Metropolis integrator (got {self.decision!r}, {self.integrator!r})")
        need(self.on_dropout in DROPOUTS, "on-dropout",
             f"unknown value {self.on_dropout!r}; choose one of {', '.join(DROPOUTS)}")
        if self.mixing_schedule:
            try:
                parse_schedule(self.mixing_schedule)
            except ValueError as err:
                raise ConfigError(f"dhmc.mixing-schedule: {err}") from None
        try:
            make_graph(self.graph, run.num_clients, run.seed)
        except ValueError as err:
            raise ConfigError(f"dhmc.graph: {err}") from None
        if getattr(model_spec(run.model), "structured", False):
            return
        model = make_model(run.model, run.noise_scale)
        if not model.has_gradient_potential():
            raise ConfigError(f"model: decentralized HMC needs the model's numpy potential; "
                              f"{run.model!r} has none (gaussian-mean, linear-regression, "
                              f"logistic-regression, ar1-student-t, bnn-classifier do)")


class Topology(NamedTuple):
    """The graph, its mixing matrix, padded neighbour lists, and its diameter."""

    neighbours: dict
    weights: np.ndarray
    senders: np.ndarray
    diameter: int
    auto_rounds: int


def topology(setup, alive=None) -> Topology:
    """The run's graph (:func:`fedbayes_flwr.algorithms.decentralized.graphs.make_graph`) and Metropolis
    weights; with
    ``alive`` (a boolean mask over the agents) the remaining graph's, in the original labels
    (``ValueError`` if it is disconnected)."""
    keep = None if alive is None or np.all(alive) else tuple(int(i) for i in np.flatnonzero(alive))
    return _topology(setup.config.graph, setup.num_clients, setup.run_seed, keep)


@functools.lru_cache(maxsize=32)
def _topology(spec: str, num_agents: int, seed: int, keep: tuple | None = None) -> Topology:
    from scipy.sparse.csgraph import shortest_path


    graph = make_graph(spec, num_agents, seed)
    width = max(1, int(graph.degrees.max()))  # the templates' width, kept when agents drop
    labels = list(range(num_agents)) if keep is None else list(keep)
    if keep is not None:
        graph = induced(graph, keep)
    small = metropolis_weights(graph)
    w = np.zeros((num_agents, num_agents))
    w[np.ix_(labels, labels)] = small
    nbrs = {labels[i]: tuple(labels[j] for j in others)
            for i, others in graph.neighbours.items()}
    senders = np.full((num_agents, width), -1, np.int64)
    for agent, others in nbrs.items():
        senders[agent, :len(others)] = others
    dist = shortest_path(graph.adjacency.astype(float), unweighted=True)
    return Topology(nbrs, w, senders, int(dist.max()) if dist.size else 0,
                    rounds_for(small, AUTO_TOLERANCE))


def mixing_rounds(config: DHMCConfig, iteration: int, topo: Topology) -> int:
    """Rounds per mixing phase at ``iteration``: ``mixing-schedule`` if set, else
    ``mixing-rounds``; ``auto`` = the rounds after which the (remaining) graph's ``W^s`` keeps at
    most 1% of a disagreement (:func:`fedbayes_flwr.algorithms.decentralized.mixing.rounds_for`)."""
    if config.mixing_schedule:
        return scheduled_rounds(parse_schedule(config.mixing_schedule), iteration)
    return topo.auto_rounds if config.mixing_rounds == AUTO else config.mixing_rounds


class ServerState(NamedTuple):
    """Routing state, the shared step size, and what the run recorded; ``alive (m,)`` which
    agents take part, ``dropped_at (m,)`` the iteration each one dropped out at (-1: never)."""

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
    alive: np.ndarray
    dropped_at: np.ndarray
    leap: int


class AgentState(NamedTuple):
    """One agent: the :class:`fedbayes_flwr.algorithms.dhmc.agents.AgentState` arrays, its current broadcast
    ``own (K, F)``, the mixed proposal, energy tracker and gradient tracker of the iteration in
    progress, its decision bits, and the step size it began the iteration with; the mass
    matrix's window statistics, the agreed inverse mass and its momentum factor (zero-size for
    ``mass-matrix = none``, and the unit mass until the first window's matrix is agreed: ``n`` of
    ``stats`` is 0 then) and the agent's own number (which agent's statistics a flood keeps)."""

    agent: H.AgentState
    own: np.ndarray
    z_mixed: np.ndarray
    aleph_mixed: np.ndarray
    y_mixed: np.ndarray
    y_kept: np.ndarray
    decided: np.ndarray
    epsilon: np.ndarray
    stats: np.ndarray
    inv_mass: np.ndarray
    factor: np.ndarray
    ident: np.ndarray
    adapted: np.ndarray


class Down(NamedTuple):
    """``inbox (width, K, F)`` from the ``senders`` (``-1``: padding; at the start the first
    slot carries the starting position ``(K, d)``, the same for every agent); ``weights`` =
    ``(W_ii, W_i,senders...)``; phase, round and iteration; the step size for the next
    iteration to begin; whether the Metropolis test is on; the number of agents taking part;
    the rounds of this phase; whether a flooding phase follows the gradient mixing; the leapfrog
    step (1 .. ``leapfrog-steps``) the mixing phases belong to."""

    inbox: np.ndarray
    senders: np.ndarray
    weights: np.ndarray
    phase: int
    round: int
    iteration: int
    epsilon: float
    metropolis: int
    agents: int
    rounds: int
    flood: int
    leap: int


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
    ``[b, y]``: ``2 d``; then the mass matrix statistics' block,
    :func:`fedbayes_flwr.algorithms.dhmc.mass.block_width` columns)."""
    d, k = setup.prior.dim, setup.config.num_chains
    return k, d, 2 * d + 1 + MM.block_width(mass_kind(setup), d, k)


def mass_kind(setup) -> str:
    """The run's mass matrix, ``auto`` resolved (:func:`fedbayes_flwr.algorithms.dhmc.mass.resolve`;
    ``none`` for ULA)."""
    c = setup.config
    if c.integrator == ULA:
        return "none"
    return MM.resolve(c.mass_matrix, setup.prior.dim, c.warmup, c.num_chains, c.decision,
                      c.adapt)


def _mass(st) -> tuple:
    """``(M^{-1}, factor)`` for the agents' maths: ``(None, None)`` for unit mass."""
    if st.inv_mass.size == 0 or st.adapted[0] < 0.5:
        return None, None
    return st.inv_mass, st.factor


def _block(st, d: int) -> np.ndarray:
    """The statistics' block of the current broadcast (``(K, 0)`` without a mass matrix)."""
    return st.own[:, 2 * d + 1:]


def local_potential(setup, data, agents: int | None = None):
    """``U_i``: the agent's likelihood potential plus ``1/m`` of the prior's, ``m`` = ``agents``
    taking part (default: all; cached by the rows' content)."""

    agents = agents or setup.num_clients

    def build():
        return H.LocalPotential(setup.model.gradient_potential(data.x, data.y),
                                from_natural(setup.prior, dense=False), agents)
    return cached(("dhmc", id(setup.model), agents, setup.prior.dim), data, build)


def initial_position(setup) -> np.ndarray:
    """``w0 (K, d)``: one prior draw per chain, the same at every agent."""
    rng = numpy_rng(derive_seed(setup.run_seed, "dhmc.init", 0, -1))
    mean, cov = G.to_moments(setup.prior)
    k = setup.config.num_chains
    if setup.prior.is_diag:  # O(d) (multivariate_normal's SVD is O(d^3): minutes at d = 7,510)
        return mean + np.sqrt(cov) * rng.standard_normal((k, mean.shape[0]))
    return rng.multivariate_normal(mean, cov, size=k)


def shared(setup, iteration: int):
    """The iteration's momentum and ``log u``, identical at every agent (read-only arrays,
    drawn once per process and iteration: every agent of an in-process run, and each agent's
    two uses, share them)."""
    return _shared(setup.run_seed, iteration, setup.config.num_chains, setup.prior.dim)


@functools.lru_cache(maxsize=8)
def _shared(run_seed: int, iteration: int, chains: int, dim: int):
    rng = numpy_rng(derive_seed(run_seed, "dhmc.momentum", iteration, -1))
    p, log_u = H.shared_draws(rng, chains, dim)
    p.setflags(write=False)
    log_u.setflags(write=False)
    return p, log_u


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


def _begin(st: AgentState, pot, setup, iteration: int, epsilon: float,
           agents: int) -> AgentState:
    c = setup.config
    xi, _ = shared(setup, iteration)
    inv_mass, factor = _mass(st)
    p = H.momentum(xi, factor)
    agent, z, a = H.begin(st.agent, pot, p, epsilon, agents, c.integrator, c.energy, inv_mass)
    if c.leapfrog_steps > 1:  # the energy change enters with the trajectory's last position
        a = agent.aleph
    own = _pad(np.concatenate([z, a[:, None]], axis=1), 2 * z.shape[1] + 1)
    k, d, f = _dims(setup)
    if f > 2 * d + 1:  # the statistics' block: a window's statistics travel in this iteration
        block = np.zeros((k, f - 2 * d - 1))
        if iteration in MM.window_ends(c.warmup):
            block = MM.pack(st.stats, k, f - 2 * d - 1)
            st = st._replace(stats=np.zeros_like(st.stats))
        own = np.concatenate([own, block], axis=1)
    return st._replace(agent=agent, own=own, epsilon=np.array([epsilon]))


def _apply_and_begin(st: AgentState, pot, setup, msg: Down) -> AgentState:
    agent = H.apply(st.agent, st.z_mixed, st.aleph_mixed, st.y_mixed, st.y_kept,
                    st.decided > 0.5)
    st = st._replace(agent=agent)
    if st.stats.size:  # the mass matrix: add this iteration's draws, adopt an agreed matrix
        kind, d, t = mass_kind(setup), agent.w.shape[1], msg.iteration
        if any(start <= t < end for start, end in MM.windows(setup.config.warmup)):
            st = st._replace(stats=MM.add(st.stats, agent.w, kind))
        if t in MM.window_ends(setup.config.warmup):
            _, stats = MM.unpack(_block(st, d), st.stats.size)
            if stats[0] > 1:  # (a dropout's restart of this iteration lost the statistics:
                # every agent holds the same flooded block, so all keep their matrix alike)
                inv = MM.estimate(stats, kind, d)
                st = st._replace(inv_mass=inv, factor=MM.factor(inv), adapted=np.ones(1))
    return _begin(st, pot, setup, msg.iteration + 1, msg.epsilon, msg.agents)


# ---------------------------------------------------------------------------- bundle functions
def _init_server(setup) -> ServerState:
    k, d, f = _dims(setup)
    eps = setup.config.step_size
    m = setup.num_clients
    return ServerState(0, START, 0, np.zeros((m, k, f)), eps, H.dual_averaging_init(eps), (), (),
                       (), np.zeros((m, k, d)), 0, 0, time.time(), np.ones(m, bool),
                       np.full(m, -1, np.int64), 1)


def _client_state_template(setup) -> AgentState:
    k, d, f = _dims(setup)
    zk, zkd = np.zeros(k), np.zeros((k, d))
    agent = H.AgentState(zkd, zkd, zkd, zk, zk, zkd, zkd, zk, zkd, zk, zkd)
    kind = mass_kind(setup)
    shape = {"none": (0,), "diagonal": (d,), "dense": (d, d)}[kind]
    return AgentState(agent, np.zeros((k, f)), zkd, zk, zkd, zkd, zk, np.zeros(1),
                      np.zeros(MM.num_stats(kind, d)), np.zeros(shape), np.zeros(shape),
                      np.zeros(1), np.zeros(1))


def _init_client(setup, partition_id: int) -> AgentState:
    return _client_state_template(setup)._replace(ident=np.array([float(partition_id)]))


def _phase_rounds(state: ServerState, setup, topo: Topology) -> int:
    """How many exchanges the current phase has."""
    if state.phase == FLOOD:
        return topo.diameter
    return 0 if state.phase == START else mixing_rounds(setup.config, state.iteration, topo)


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    topo = topology(setup, state.alive)
    c = setup.config
    metropolis = int(state.iteration >= c.warmup or c.warmup_metropolis)
    width = topo.senders.shape[1]
    outbox = state.outbox
    if state.phase == START:  # the starting position travels in every agent's first slot
        k, d, f = _dims(setup)
        outbox = np.zeros((1, k, f))
        outbox[0, :, :d] = _start_position(state, setup)
        routed = {a: (np.concatenate([outbox, np.zeros((width - 1, k, f))]),
                      np.full(width, -1, np.int64), np.zeros(width + 1)) for a in topo.neighbours}
    else:
        routed = padded_inboxes(outbox, topo.neighbours, topo.weights, width)
    flood = int(c.decision == "agree" and topo.diameter > 0)
    rounds = _phase_rounds(state, setup, topo)
    agents = int(np.sum(state.alive))
    return {agent: Request(STEP, Down(inbox, senders, weights, state.phase, state.round,
                                      state.iteration, float(state.epsilon), metropolis, agents,
                                      rounds, flood, int(state.leap)))
            for agent, (inbox, senders, weights) in sorted(routed.items())}


def _start_position(state: ServerState, setup) -> np.ndarray:
    """``(K, d)``: the prior draw at the first start; after a dropout, the survivors' average
    iterate (``last_w``, NaN for the dropped)."""
    if state.exchanges == 0:
        return initial_position(setup)
    return np.nanmean(state.last_w[state.alive], axis=0)


def _client_step(seed, st: AgentState, request: Request, data, setup):
    msg, c = request.message, setup.config
    pot = local_potential(setup, data, msg.agents)
    k, d, f = _dims(setup)
    prob, evals, decided = np.zeros(k), 0, np.zeros(k)
    if c.integrator == ULA:
        return _ula_step(seed, st, msg, pot, setup)
    if msg.phase == START:  # first exchange, or a restart after a dropout
        st = st._replace(agent=H.init_agent(pot, msg.inbox[0][:, :d]))
        st = _begin(st, pot, setup, msg.iteration, msg.epsilon, msg.agents)
        evals = 1 + (c.energy == "exact")
    elif msg.phase == MIX_ZA:
        st = st._replace(own=_mix(st.own, msg))
        if msg.round == msg.rounds:  # z' and aleph' final: track the gradient at z'
            z, a = st.own[:, :d], st.own[:, d]
            if msg.leap == 1:
                agent, b = H.track(st.agent, pot, z)
                kept = agent.y
            else:  # along the trajectory: the previous position's tracker and local gradient
                agent, b = H.track(st.agent, pot, z, st.y_mixed, st.agent.grad_z)
                kept = st.y_kept
            st = st._replace(agent=agent, z_mixed=z, aleph_mixed=a,
                             own=np.concatenate([b, kept, np.zeros((k, 1)), _block(st, d)],
                                                axis=1))
            evals = 1
    elif msg.phase == MIX_B:
        st = st._replace(own=_mix(st.own, msg))
        if msg.round == msg.rounds and msg.leap < c.leapfrog_steps:  # the next position
            y, y_kept = st.own[:, :d], st.own[:, d:2 * d]
            last = msg.leap + 1 == c.leapfrog_steps
            agent, z = H.advance(st.agent, pot, st.z_mixed, y, float(st.epsilon[0]), msg.agents,
                                 last, _mass(st)[0])
            a = st.aleph_mixed + (agent.c - agent.c_last if last else 0.0)
            st = st._replace(agent=agent, y_mixed=y, y_kept=y_kept,
                             own=np.concatenate([z, a[:, None], np.zeros((k, d)),
                                                 _block(st, d)], axis=1))
            evals = 0
        elif msg.round == msg.rounds:  # y' final: this agent's Metropolis decision
            y, y_kept = st.own[:, :d], st.own[:, d:2 * d]
            _, log_u = shared(setup, msg.iteration)
            out = H.decide(st.agent, st.aleph_mixed, y, log_u, float(st.epsilon[0]),
                           msg.agents, c.integrator, bool(msg.metropolis), _mass(st)[0])
            prob, decided = out.accept_prob, out.accepted.astype(np.float64)
            own = _pad(decided, f)
            if f > 2 * d + 1:  # the flood keeps the lowest-numbered agent's mixed statistics
                _, stats = MM.unpack(_block(st, d), st.stats.size)
                own[:, 2 * d + 1:] = MM.pack(stats, k, f - 2 * d - 1, float(st.ident[0]))
            st = st._replace(y_mixed=y, y_kept=y_kept, decided=decided, own=own)
            if not msg.flood:
                st = _apply_and_begin(st, pot, setup, msg)
                evals = c.energy == "exact"
    elif msg.phase == FLOOD:  # the AND of the neighbours' bits: after D rounds, everyone's
        bits = st.own[:, 0].copy()
        block = _block(st, d)
        for j, sender in enumerate(msg.senders):
            if sender >= 0:
                bits = np.minimum(bits, msg.inbox[j][:, 0])
                theirs = msg.inbox[j][:, 2 * d + 1:]
                if theirs.size and theirs[0, 0] < block[0, 0]:
                    block = theirs
        own = _pad(bits, f)
        own[:, 2 * d + 1:] = block
        st = st._replace(own=own, decided=bits)
        decided = bits
        if msg.round == msg.rounds:
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
    m = msg.agents
    evals = 0
    if msg.phase == START:
        w = msg.inbox[0][:, :d]
        st = st._replace(agent=st.agent._replace(w=w), own=_pad(w, f))
    else:
        st = st._replace(own=_mix(st.own, msg))
        if msg.round == msg.rounds:
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
    topo = topology(setup, state.alive)
    rounds = _phase_rounds(state, setup, topo)
    if c.integrator == ULA:
        if state.phase == START:
            return MIX_ZA, 1, False
        done = state.round == rounds
        return MIX_ZA, 1 if done else state.round + 1, done
    flood = c.decision == "agree" and topo.diameter > 0
    if state.phase == START:
        return MIX_ZA, 1, False
    if state.phase == MIX_ZA:
        return (MIX_ZA, state.round + 1, False) if state.round < rounds else (MIX_B, 1, False)
    if state.phase == MIX_B:
        if state.round < rounds:
            return MIX_B, state.round + 1, False
        if state.leap < c.leapfrog_steps:  # the trajectory's next position
            return MIX_ZA, 1, False
        return (FLOOD, 1, False) if flood else (MIX_ZA, 1, True)
    if state.round < rounds:
        return FLOOD, state.round + 1, False
    return MIX_ZA, 1, True


def _full(state: ServerState, good, field: str) -> np.ndarray:
    """``(m, ...)`` of a reply field over every agent (NaN rows for those not taking part)."""
    first = np.asarray(getattr(good[0][1], field), dtype=np.float64)
    out = np.full((len(state.alive), *first.shape), np.nan)
    for pid, reply in good:
        out[pid] = getattr(reply, field)
    return out


def _drop(state: ServerState, setup, rejected, good) -> tuple[ServerState, StepInfo]:
    """``on-dropout = continue``: drop the agents that failed (after the engines' retries) and
    restart the interrupted iteration over the remaining graph (module docstring)."""
    failed = sorted(r.partition_id for r in rejected)
    alive = state.alive.copy()
    alive[failed] = False
    where = f"iteration {state.iteration}: agent(s) {failed} dropped out"
    if not alive.any():
        raise RunStopped(f"{where} and no agent is left")
    try:
        topology(setup, alive)
    except ValueError as err:
        raise RunStopped(f"{where}; {err}, so the run stops (the samples so far are saved)"
                         ) from None
    last_w = state.last_w.copy()
    for pid, reply in good:  # the survivors' iterates before the interrupted iteration
        last_w[pid] = reply.w
    last_w[~alive] = np.nan
    dropped_at = state.dropped_at.copy()
    dropped_at[failed] = state.iteration
    new = state._replace(phase=START, round=0, outbox=np.zeros_like(state.outbox), alive=alive,
                         dropped_at=dropped_at, last_w=last_w, exchanges=state.exchanges + 1,
                         leap=1)
    return new, StepInfo(updates=0, accepted=tuple(pid for pid, _ in good), rejected=rejected,
                         diagnostics={"dhmc_dropped": failed,
                                      "dhmc_agents": int(alive.sum())})


def _server_step(state: ServerState, replies, setup, rnd):
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    good = sorted(((pid, r) for pid, r in replies if not isinstance(r, Rejection)),
                  key=lambda item: item[0])
    if rejected:  # on-dropout = stop: the engines stop before this (retry-stop)
        return _drop(state, setup, rejected, good)
    c = setup.config
    outbox = np.zeros_like(state.outbox)
    for pid, reply in good:
        outbox[pid] = reply.out
    evals = state.grad_evals + sum(int(r.grad_evals) for _, r in good)
    eps, adaptation = state.epsilon, state.adaptation
    accepts, disagreements = state.accepts, state.disagreements
    decided_phase = (state.phase == MIX_B and state.leap == c.leapfrog_steps
                     and state.round == mixing_rounds(c, state.iteration,
                                                      topology(setup, state.alive)))
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
                if (state.iteration in MM.window_ends(c.warmup)
                        and mass_kind(setup) != "none"):  # a new mass matrix: start afresh
                    adaptation = H.dual_averaging_init(eps)
        else:
            disagreements = disagreements + (float(np.mean(own.any(0) & ~own.all(0))),)
    phase, rnd_next, complete = _next_phase(state, setup)
    onward = state.phase == MIX_B and phase == MIX_ZA and not complete  # next leapfrog step
    leap = state.leap + 1 if onward else (1 if complete else state.leap)
    kept, last_w = state.kept, state.last_w
    updates = 0
    if complete:
        last_w = _full(state, good, "w")  # (m, K, d) after the decision (NaN: dropped)
        final = np.stack([r.decided for _, r in good]) > 0.5
        if state.iteration >= c.warmup:
            kept = kept + (last_w,)
            accepts = accepts + (float(final.mean()),)
        updates = 1
    new = ServerState(state.iteration + complete, phase, rnd_next, outbox, eps, adaptation, kept,
                      accepts, disagreements, last_w, state.exchanges + 1, evals, state.started,
                      state.alive, state.dropped_at, leap)
    info = StepInfo(updates=updates, accepted=tuple(pid for pid, _ in good))
    if complete and rnd.evaluate:
        info = info._replace(metrics=_metrics(new, setup))
    return new, info


def agent_samples(state: ServerState, setup) -> np.ndarray:
    """``(m, K, T, d)``: every agent's iterates after the warm-up (the last iterate if none;
    NaN for an agent from the iteration it dropped out at)."""
    if not state.kept:
        return state.last_w[:, :, None, :]
    return np.stack(state.kept, axis=2)


def pooled_samples(state: ServerState, setup) -> np.ndarray:
    """``(K, T, d)``: the average over the agents taking part at each kept iteration."""
    samples = agent_samples(state, setup)
    with np.errstate(invalid="ignore"):
        return np.nanmean(samples, axis=0) if not state.alive.all() else samples.mean(axis=0)


def _metrics(state: ServerState, setup) -> dict:
    samples = agent_samples(state, setup)
    pooled = pooled_samples(state, setup).reshape(-1, samples.shape[-1])
    var = pooled.var(axis=0) if pooled.shape[0] > 1 else None
    consensus = (float(np.mean(np.nanvar(samples, axis=0) / np.where(var > 0, var, 1.0)))
                 if var is not None else float("nan"))
    ula = setup.config.integrator == ULA  # no Metropolis test: no acceptance rate
    return {"iterations": int(state.iteration), "step_size": float(state.epsilon),
            "acceptance_rate": (float(np.mean(state.accepts)) if state.accepts and not ula
                                else float("nan")),
            "disagreement_rate": (float(np.mean(state.disagreements))
                                  if state.disagreements else 0.0),
            "consensus_error": consensus, "exchanges": int(state.exchanges),
            "grad_evals": int(state.grad_evals), "agents": int(state.alive.sum()),
            "wall_s": round(time.time() - state.started, 3)}


def _posterior(state: ServerState, setup):
    samples = agent_samples(state, setup)
    return TracePosterior(pooled_samples(state, setup),
                          extras={"agent_samples": samples,
                                  "dropped_at": state.dropped_at.astype(np.float64)},
                          counts={"grad_evals": float(state.grad_evals),
                                  "exchanges": float(state.exchanges)})


def _done(state: ServerState, setup) -> bool:
    c = setup.config
    if c.iterations > 0:
        return len(state.kept) >= c.iterations
    if len(state.kept) < 20:  # the wall-clock cap is the run's max-seconds (preset): time-limit
        return False

    return bool(np.min(SamplePosterior(pooled_samples(state, setup)).ess()) >= c.target_ess)


def _actions(setup) -> dict[str, ActionSpec]:
    k, d, f = _dims(setup)
    width = topology(setup).senders.shape[1]
    down = Down(np.zeros((width, k, f)), np.zeros(width, np.int64), np.zeros(width + 1), 0, 0, 0,
                0.0, 0, 0, 0, 0, 0)
    up = Up(np.zeros((k, f)), np.zeros((k, d)), np.zeros(k), np.zeros(k), 0, 0)
    return {STEP: ActionSpec("train", down, up)}


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """This iteration's reply; the agent's iterate ``w`` within ``2**26`` prior standard
    deviations of the prior mean (:func:`fedbayes_flwr.algorithms.bounds.position_error`);
    acceptance probabilities in [0, 1]."""
    if reply.iteration != state.iteration:
        return "iteration", f"answers iteration {reply.iteration}, expected {state.iteration}"
    far = bounds.position_error("w", reply.w, setup.prior)
    if far is not None:
        return far
    if reply.grad_evals < 0:
        return "grad_evals", f"must be >= 0, got {reply.grad_evals}"
    if np.any((reply.accept_prob < 0) | (reply.accept_prob > 1)):
        return "accept_prob", "must be in [0, 1]"
    return None


def _corrupt(kind: str, reply, request: Request):
    raise ValueError(f"dhmc cannot make a {kind!r} fault")


def _failure_policy(config: DHMCConfig) -> str:
    """Retry, then stop; or, with ``on-dropout = continue``, retry then drop the agent."""
    return "retry" if config.on_dropout == "continue" else "retry-stop"


def _prior_diag(config: DHMCConfig, model) -> bool:
    return True


def _memory_estimate(setup) -> MemoryEstimate:
    """The agents' arrays: each of the ``A`` agents keeps about ten ``(C, F)`` arrays (its
    iterate, momentum, gradient and energy trackers, mixed proposal, in- and outbox; broadcast
    width ``F = 2 d``), plus the server's outbox: ``(10 A + 4) 2 C d`` float64s."""
    a, c = setup.num_clients, setup.config.num_chains
    d = setup.model.param_dim(setup.num_features)
    nbytes = (10 * a + 4) * 2 * c * d * 8
    return MemoryEstimate(nbytes, f"(10 A + 4) 2 C d float64s, A = {a}, C = {c}, d = {d}",
                          "use fewer chains (dhmc.num-chains) or agents")


BUNDLE = Bundle(
    name="dhmc", config_class=DHMCConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, done=_done, failure_policy=_failure_policy, corrupt=_corrupt,
    prior_diag=_prior_diag, memory_estimate=_memory_estimate)


def _preset(**section):
    def preset(c):
        changes = {}
        if c.num_rounds == 10:  # the common default: the run's own length, or no cap (ESS)
            fixed = c.section.iterations
            changes["num_rounds"] = c.section.warmup + fixed if fixed > 0 else NO_CAP
        if c.eval_every == 1:
            changes["eval_every"] = DEFAULT_EVAL_EVERY
        if c.section.iterations == 0 and c.max_seconds == 0 and c.section.max_seconds > 0:
            changes["max_seconds"] = c.section.max_seconds  # the cap ends as "time-limit"
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
