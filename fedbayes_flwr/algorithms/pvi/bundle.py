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

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import commit
from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, Rejection, Request, StepInfo, auto_or_number
from fedbayes_flwr.algorithms.commit import NO_ROUND, Pending
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.algorithms.pvi.tempered import tempered
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.posterior import GaussianPosterior
from fedbayes_flwr.seeds import derive_seed, numpy_rng

if TYPE_CHECKING:
    from fedbayes_flwr.inference.vi import VIConfig

SCHEDULES = ("synchronous", "sequential", "asynchronous")
CAVITIES = ("pvi", "no-deletion", "same-prior", "split-prior")
LOCAL_OPTIMISERS = ("auto", "adam", "fixed-point")
COVARIANCES = ("auto", "full", "diag")
ACCELERATIONS = ("none", "anderson")
TRAIN, EVALUATE = "train", "evaluate"
STEP, CANDIDATES = "step", "candidates"  # the server-held-factor protocol's two actions
_PHASE_TRAIN, _PHASE_EVALUATE, _PHASE_SEARCH = 0, 1, 2


@dataclass(frozen=True)
class PVIConfig:
    """PVI hyper-parameters: the run-config section ``[tool.flwr.app.config.pvi]`` (``pvi.<key>``).

    Attributes
    ----------
    schedule : str
        ``synchronous``, ``sequential`` or ``asynchronous`` (``pvi.schedule``).
    damping : float or "auto"
        ``auto`` (default): the server picks the step on the round's combined delta, trying ``1``
        first and backtracking while the global free energy falls (see the module docstring).
        A number ``rho`` in (0, 1]: the first step tried (with ``guard``), or the fixed damping
        each client applies to its delta (``guard = false``, the paper's protocol).
    server_damping : float
        ``rho_s`` in (0, 1]: multiplies the step (client-held factors: the server applies
        ``rho_s * delta`` and the client commits ``t_k + rho_s * delta``); the effective step is
        ``damping * server-damping`` (set one of the two).
    guard : bool
        Divergence guard for numeric damping: evaluate the free energy of the step and its
        halvings each round and back off when it falls (server-held factors). ``auto`` always
        has it. ``false`` with a numeric damping is the paper's protocol (nothing checked).
    guard_tolerance : float
        Relative tolerance of the step rule: a step is kept if
        ``F(s) >= F(0) - tol * max(1, |F(0)|)``.
    line_search_steps : int
        Steps evaluated per search exchange: the first step and its halvings.
    max_backtracks : int
        Search exchanges per round before the round is rolled back (each sends
        ``line-search-steps`` further halvings).
    acceleration : str
        ``none`` or ``anderson`` (server-side Anderson acceleration of the natural-parameter
        iteration, safeguarded by the same rule; synchronous schedule).
    anderson_memory : int
        Anderson window ``m`` (differences kept).
    step_rule : str
        Which acceptable candidate step to take: ``largest`` (backtracking: the first step
        whose free energy has not fallen), ``best`` (the highest free energy among them),
        ``safe`` (the highest among those that also pass a sufficient-increase test and keep a
        margin of a factor 2 to a step that lowers the free energy; the unit step when it is the
        best: :func:`fedbayes_flwr.algorithms.pvi.step.choose`) or ``auto`` (the default):
        ``largest`` for models with exact expectations (linear, logistic: 11 / 18 / 19 rounds
        to the optimum on the benchmark's logistic problem, against 12 / 19 / 19 for ``safe``),
        ``safe`` for Monte-Carlo ones with ``damping = auto`` (a numeric damping with the guard
        backtracks from it: ``largest``) (BNNs: the largest acceptable step alternates 0.25 / 0.5
        and ends at 0.861 test accuracy on the digits BNN, ``safe`` with the step memory and the
        non-monotone window at 0.906, and with the proximal local solves of ``proximal = auto``
        at 0.947; ``benchmarks/pvi_damping.py``).
    sufficient_increase : float
        ``c`` in [0, 1) of the ``safe`` rule's test ``F(s) - F(0) >= c * s * g``.
    step_memory : bool
        (Default true.) Trust-region step memory for server-held factors: a round's first candidate step is at
        most twice the last step taken (round 1, and after Anderson steps: the first step as
        set), so after a cliff the search does not start from the unit step again (Nocedal &
        Wright 2006, Section 4.1: grow the trust region by at most a factor 2).
    nonmonotone : int
        Window ``W`` of the non-monotone fallback (default 5; 0: off; ``damping = auto`` only,
        so the guard of a numeric damping stays strict). When no candidate of a round's first
        search exchange keeps the free energy, take the largest candidate step at most the last
        step taken whose free energy is at least the lowest of the last ``W`` rounds' free
        energies, instead of backtracking to tiny steps (Grippo, Lampariello & Lucidi 1986's
        non-monotone line search, for ascent). The lowest free energy of any ``W`` consecutive
        rounds then never falls, but single rounds may. Why: on the digits BNN the clients'
        combined delta can be a consistent descent direction (three local-solve seeds' deltas
        agree to cosine 0.99 in the means and 0.97 in the log-variances; the free energy falls
        linearly from ``s = 0``), so a monotone rule stalls there, while fixed damping moves on
        and recovers.
    proximal : float or "auto"
        KL-proximal local solves (server-held synchronous factors): with ``beta > 0`` a
        client maximises ``E_q[log p(y_k | theta)] - KL(q || q_cav) - beta * KL(q || q_now)``
        (:func:`undamped_change`), whose solution pulls its change toward a natural-gradient
        step of size ``1 / (1 + beta)``; the changes of infinitesimal local steps add up to the
        global natural gradient, those of full local solves need not. ``auto`` (the default;
        ``damping = auto`` only, else 0): ``beta = 1`` from round 1 for models whose local
        solves are Monte Carlo (BNNs), 0 for models with exact expectations (conjugate,
        logistic: their plain deltas never stalled), and after every round whose first search
        exchange finds no step that keeps the free energy ``max(1, 2 beta)``, up to
        :data:`PROXIMAL_MAX`, never lowered. Measured on the digits BNN (seed 0, round 12, where
        the plain combined delta lowers the free energy at every step, by 83 nats at ``s =
        1/2``): the proximal deltas with ``beta = 1 / 3 / 9`` raise it by 134 / 158 / 160 nats
        at ``s = 1/2``. Over 20 synchronous rounds on five seeds (``benchmarks/pvi_damping.py``) the
        digits BNN ends at 0.951 mean test accuracy, against 0.928 without proximal solves and
        0.933 for the best fixed damping (0.2), and no round stalled. A number: that ``beta``
        every round (0: plain local solves). Conjugate models: the change is exactly the plain
        one times ``1 / (1 + beta)``.
    covariance : str
        ``auto`` (mean-field for BNNs, full otherwise), ``full`` or ``diag``.
    local_optimiser : str
        ``auto`` (the deterministic solver :func:`fedbayes_flwr.inference.vi.solve_local` for models with
        exact expectations, i.e. linear and logistic models; Adam for BNNs), ``adam``
        (Monte-Carlo ELBO) or ``fixed-point`` (damped natural-gradient iterations).
    local_steps, learning_rate, mc_samples, batch_size : int, float, int, int
        Adam settings (:class:`fedbayes_flwr.inference.vi.VIConfig`).
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
    damping: float | str = "auto"
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
    guard: bool = True
    guard_tolerance: float = 1e-6
    line_search_steps: int = 4
    max_backtracks: int = 3
    acceleration: str = "none"
    anderson_memory: int = 5
    step_rule: str = "auto"
    sufficient_increase: float = 0.5
    step_memory: bool = True
    nonmonotone: int = 5
    proximal: float | str = "auto"

    def __post_init__(self):  # TOML / CLI give "auto" or a number (maybe as text)
        object.__setattr__(self, "damping", auto_or_number(self.damping, float))
        object.__setattr__(self, "proximal", auto_or_number(self.proximal, float))

    def first_proximal(self, monte_carlo: bool = False) -> float:
        """The proximal weight ``beta`` of round 1: a number as set; ``auto`` with ``damping =
        auto`` (synchronous) 1 for models whose local solves are Monte Carlo (``monte_carlo``:
        no deterministic expectations, e.g. BNNs) and 0 for the others; otherwise 0."""
        if self.proximal != "auto":
            return float(self.proximal)
        return 1.0 if monte_carlo and self.adaptive_proximal else 0.0

    @property
    def adaptive_proximal(self) -> bool:
        """Whether ``beta`` grows on a stalled round (``proximal = auto`` with ``damping =
        auto``, synchronous)."""
        return self.proximal == "auto" and self.auto and self.schedule == "synchronous"

    @property
    def auto(self) -> bool:
        return self.damping == "auto"

    @property
    def rho(self) -> float:
        """The client-side damping (client-held factors) or the first step's factor."""
        return 1.0 if self.auto else float(self.damping)

    @property
    def first_step(self) -> float:
        """The first step the server tries (server-held factors): ``rho * rho_s``."""
        return self.rho * self.server_damping

    @property
    def server_held(self) -> bool:
        """Whether the run uses server-held factors and the server's step rule: synchronous
        PVI with ``auto`` or the guard. Sequential and asynchronous PVI keep client-held factors
        (``auto`` is damping 1 there: see the module docstring)."""
        return ((self.schedule == "synchronous" and (self.auto or self.guard))
                or (self.schedule == "asynchronous" and self.auto))

    @property
    def num_candidates(self) -> int:
        """Candidate posteriors per search exchange: the current ``q``, the plain steps, and
        Anderson's extrapolation."""
        return 1 + self.line_search_steps + (self.acceleration == "anderson")

    @property
    def vi(self) -> VIConfig:
        from fedbayes_flwr.inference.vi import VIConfig  # imports TensorFlow: only where a solver needs it

        return VIConfig(self.local_steps, self.learning_rate, self.mc_samples, self.batch_size)

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use;
        ``run`` is the whole :class:`fedbayes_flwr.runtime.config.RunConfig`."""
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"pvi.{key}: {msg}")

        for key, value, allowed in (("schedule", self.schedule, SCHEDULES),
                                    ("covariance", self.covariance, COVARIANCES),
                                    ("local-optimiser", self.local_optimiser, LOCAL_OPTIMISERS),
                                    ("cavity", self.cavity, CAVITIES)):
            need(value in allowed, key,
                 f"unknown {key.replace('-', ' ')} {value!r}; choose one of {', '.join(allowed)}")
        need(self.auto or isinstance(self.damping, float), "damping",
             f"expected 'auto' or a number in (0, 1], got {self.damping!r}")
        for key, value in (("damping", self.rho), ("server-damping", self.server_damping),
                           ("local-damping", self.local_damping)):
            need(0 < value <= 1, key, f"must be in (0, 1], got {value}")
        need(self.acceleration in ACCELERATIONS, "acceleration",
             f"unknown acceleration {self.acceleration!r}; choose one of "
             f"{', '.join(ACCELERATIONS)}")
        need(self.acceleration == "none" or self.schedule == "synchronous", "acceleration",
             f"anderson needs the synchronous schedule, not {self.schedule!r}")
        need(self.acceleration == "none" or self.server_held, "acceleration",
             "anderson needs the server's step rule (damping='auto' or guard=true)")
        need(self.acceleration == "none" or not self.optimise_prior, "acceleration",
             "anderson cannot be combined with optimise-prior (the prior moves the iterates)")
        need(0 <= self.guard_tolerance < 1, "guard-tolerance",
             f"must be in [0, 1), got {self.guard_tolerance}")
        need(self.line_search_steps >= 1, "line-search-steps",
             f"must be >= 1, got {self.line_search_steps}")
        need(self.max_backtracks >= 1, "max-backtracks", f"must be >= 1, got {self.max_backtracks}")
        need(self.step_rule in S.STEP_RULES, "step-rule",
             f"unknown step rule {self.step_rule!r}; choose one of {', '.join(S.STEP_RULES)}")
        need(0 <= self.sufficient_increase < 1, "sufficient-increase",
             f"must be in [0, 1), got {self.sufficient_increase}")
        need(self.nonmonotone >= 0, "nonmonotone",
             f"must be >= 0 (0: off), got {self.nonmonotone}")
        need(self.proximal == "auto" or (isinstance(self.proximal, float)
                                          and self.proximal >= 0), "proximal",
             f"expected 'auto' or a number >= 0 (0: plain local solves), got {self.proximal!r}")
        need(self.proximal in ("auto", 0.0) or (self.server_held
                                                 and self.schedule == "synchronous"),
             "proximal", "a proximal weight needs the synchronous schedule with server-held "
             "factors (damping='auto' or guard=true)")
        need(self.anderson_memory >= 1, "anderson-memory",
             f"must be >= 1, got {self.anderson_memory}")
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
    what the next exchange is (``phase``: train, the free-energy query, or a step search).

    With server-held factors it also holds every client's factor ``factors`` (stacked:
    ``eta1 (M, d)``, ``eta2 (M, d[, d])``), the round's undamped deltas ``deltas`` and which
    clients sent one (``received``), the search exchanges made this round (``search``), the free
    energy of ``posterior`` (``free_energy``, NaN when not every client evaluated it) and the
    Anderson history.
    """

    prior: NaturalGaussian
    posterior: NaturalGaussian
    server_round: int
    accepted_round: np.ndarray  # int64 (num_clients,), NO_ROUND where nothing accepted yet
    phase: int = _PHASE_TRAIN
    factors: NaturalGaussian | None = None
    deltas: NaturalGaussian | None = None
    received: np.ndarray | None = None
    search: int = 0
    free_energy: float = float("nan")
    history: S.History | None = None
    last_step: float = float("nan")  # the step taken last round (step memory); NaN: none yet
    recent: tuple = ()  # free energies of the last rounds (non-monotone window), oldest first
    proximal: float = 0.0  # the proximal weight beta of the next round's local solves


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


def _stacked_zeros(prior: NaturalGaussian, count: int) -> NaturalGaussian:
    return NaturalGaussian(np.zeros((count, *prior.eta1.shape)),
                           np.zeros((count, *prior.eta2.shape)))


def init_server(prior: NaturalGaussian, num_clients: int,
                config: PVIConfig | None = None, monte_carlo: bool = False) -> ServerState:
    """Start with ``q = prior`` and every ``t_k = 1`` (held by the server too when ``config``
    uses server-held factors; ``monte_carlo``: the model's local solves are Monte Carlo, which
    sets the first proximal weight of ``proximal = auto``)."""
    G.check_proper(prior, "prior")
    state = ServerState(prior, prior, 0, np.full(num_clients, NO_ROUND, dtype=np.int64))
    if config is None or not config.server_held:
        return state
    zeros = _stacked_zeros(prior, num_clients)
    return state._replace(factors=zeros, deltas=zeros,
                          received=np.zeros(num_clients, dtype=bool),
                          history=S.init_history(zeros, config.anderson_memory),
                          proximal=config.first_proximal(monte_carlo))


def factor_of(state: ServerState, partition_id: int) -> NaturalGaussian:
    """Client ``partition_id``'s factor as the server holds it."""
    return NaturalGaussian(state.factors.eta1[partition_id], state.factors.eta2[partition_id])


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
    # TensorFlow is imported here, not with this module: conjugate models never need it, and a
    # deployed node starts a new process per message (FLOWER_NOTES: ~4 s of TensorFlow import)
    from fedbayes_flwr.inference.vi import fit_fixed_point, fit_gaussian, solve_local

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
    delta = G.scale(change, config.rho)
    pending = G.add(state.value, G.scale(delta, config.server_damping))
    return commit.propose(state, pending, message.server_round), ClientMessage(
        delta, int(x.shape[0]), message.server_round)


def undamped_change(seed, message: StepMessage, model, x, y, config: PVIConfig,
                    prior: NaturalGaussian | None = None, num_clients: int = 1) -> ClientMessage:
    """Server-held factors: the undamped change ``t_k' - t_k`` of the factor the server sent
    (without deletion: ``q' / q``); the client keeps nothing (the server picks the step).

    With a proximal weight ``beta = message.proximal > 0`` the local solve is

        q_k = argmax_q  E_q[log p(y_k | theta)] - KL(q || q_cav) - beta * KL(q || q),

    that is (the two KLs merge, natural parameters) ``a * E_q[log p(y_k | theta)] - KL(q || r)``
    with ``a = 1 / (1 + beta)`` and ``r = a * (q_cav + beta * q)``; ``t_k' = q_k / q_cav`` as
    before. As ``beta`` grows the change tends to ``a`` times the local natural gradient, and
    the clients' changes add up to ``a`` times the global one, an ascent direction of the
    global free energy.

    References
    ----------
    Ashman et al. (2022), PVI, eq. (2)-(3) (local free energy, factor update); Khan & Rue (2023),
    "The Bayesian Learning Rule", eq. (7) and Section 1.2 (a KL-proximal step is a natural-
    gradient step); Parikh & Boyd (2014), "Proximal Algorithms", Section 4.1.
    """
    factor = message.factor
    cavity = cavity_for(config, message.posterior, factor, prior, num_clients)
    beta = float(message.proximal)
    if beta > 0:
        power = 1.0 / (1.0 + beta)
        target = G.scale(G.add(cavity, G.scale(message.posterior, beta)), power)
        q_new = local_optimum(seed, tempered(model, power), x, y, target, message.posterior,
                              config)
    else:
        q_new = local_optimum(seed, model, x, y, cavity, message.posterior, config)
    if config.cavity == "no-deletion":
        change = G.sub(q_new, message.posterior)
    else:
        change = G.sub(G.sub(q_new, cavity), factor)
    return ClientMessage(change, int(x.shape[0]), message.server_round)


def candidate_terms(message: CandidateMessage, model, x, y) -> CandidateReply:
    """``E_q[log p(y_k | theta)]`` at every candidate ``q`` of a step search."""

    terms = [model.expected_log_likelihood(
        GaussianPosterior(G.make(message.eta1[j], message.eta2[j])), x, y)
        for j in range(message.eta1.shape[0])]
    return CandidateReply(np.asarray(terms, dtype=np.float64))


class Candidates(NamedTuple):
    """One search exchange: the candidate posteriors (stacked; improper ones replaced by the
    current ``q`` and flagged), the plain step of each (0 for the current ``q``, NaN for
    Anderson's point), which are proper, and Anderson's factors (or None)."""

    posteriors: NaturalGaussian
    steps: np.ndarray
    proper: np.ndarray
    anderson: NaturalGaussian | None


def _combined(state: ServerState, step: float) -> NaturalGaussian:
    """``q + step * delta_k`` for every client that sent one, in partition order."""
    posterior = state.posterior
    for pid in np.flatnonzero(state.received):
        delta = NaturalGaussian(state.deltas.eta1[pid], state.deltas.eta2[pid])
        posterior = G.add(posterior, G.scale(delta, step))
    return posterior


def _with_factors(state: ServerState, factors: NaturalGaussian) -> NaturalGaussian:
    """``q`` with every client's factor replaced by ``factors`` (stacked): ``q`` times
    ``prod_k factors_k / t_k``."""
    change = NaturalGaussian(factors.eta1.sum(0) - state.factors.eta1.sum(0),
                             factors.eta2.sum(0) - state.factors.eta2.sum(0))
    return G.add(state.posterior, G.like(state.posterior, change))


def round_first_step(state: ServerState, config: PVIConfig) -> float:
    """The first candidate step of this round: ``first-step``, or with ``step-memory`` at most
    twice the last step taken."""
    last = state.last_step
    if config.step_memory and np.isfinite(last) and last > 0:
        return min(config.first_step, 2.0 * float(last))
    return config.first_step


def candidates(state: ServerState, config: PVIConfig) -> Candidates:
    """The candidates of search exchange ``state.search`` (see :mod:`pvi_step`)."""
    steps = S.step_sizes(round_first_step(state, config), config.line_search_steps,
                         state.search)
    posts = [state.posterior] + [_combined(state, float(s)) for s in steps]
    all_steps = [0.0, *steps.tolist()]
    aa = None
    if config.acceleration == "anderson":
        aa = S.anderson(state.history) if state.search == 0 else None
        if aa is None:
            posts.append(state.posterior)
        else:
            posts.append(_with_factors(state, aa))
        all_steps.append(float("nan"))
    proper = np.array([bool(np.all(np.isfinite(q.eta1)) and np.all(np.isfinite(q.eta2))
                            and G.is_proper(q)) for q in posts])
    if aa is None and config.acceleration == "anderson":
        proper[-1] = False
    posts = [q if ok else state.posterior for q, ok in zip(posts, proper, strict=True)]
    stack = NaturalGaussian(np.stack([q.eta1 for q in posts]), np.stack([q.eta2 for q in posts]))
    return Candidates(stack, np.asarray(all_steps), proper, aa)


def search_step(state: ServerState, replies, config: PVIConfig, num_clients: int,
                exact_free_energy: bool = True):
    """Pick the step from the clients' expected log-likelihoods at the candidates and apply it
    (or ask for the next halvings, or roll the round back). ``exact_free_energy``: the model's
    expectations are deterministic (not Monte Carlo). Returns ``(state, StepInfo)``."""
    cands = candidates(state, config)
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    answered = [r for _, r in sorted(replies, key=lambda r: r[0]) if not isinstance(r, Rejection)]
    complete = len(answered) == num_clients
    diagnostics = {"pvi_search_exchanges": state.search + 1}
    if not answered:
        return _finish(state, 0.0, None, None, rejected, complete, {
            **diagnostics, "pvi_guard": "no client evaluated the candidates; round rolled back"},
            config.nonmonotone)
    ells = np.sum([r.expected_log_likelihood for r in answered], axis=0)
    values = np.array([S.free_energy(G.make(cands.posteriors.eta1[j], cands.posteriors.eta2[j]),
                                     state.prior, ells[j]) if cands.proper[j] else -np.inf
                       for j in range(len(ells))])
    f0, plain = values[0], values[1:1 + config.line_search_steps]
    rule = config.step_rule
    if rule == "auto":  # a numeric damping with the guard: plain backtracking from it
        rule = "safe" if config.auto and not exact_free_energy else "largest"
    index = S.choose(f0, plain, config.guard_tolerance, rule,
                     cands.steps[1:1 + config.line_search_steps], config.sufficient_increase,
                     first_has_margin=state.search == 0, unit_if_best=exact_free_energy)
    if cands.anderson is not None:
        aa_value = values[-1]
        floor = f0 - config.guard_tolerance * max(1.0, abs(f0))
        good = bool(np.isfinite(aa_value) and aa_value >= floor)
        diagnostics["pvi_anderson"] = bool(good)
        if good:
            return _finish(state, float("nan"), cands.anderson, float(aa_value), rejected,
                           complete, diagnostics, config.nonmonotone)
        state = state._replace(history=S.restart(state.history))
    steps = cands.steps[1:1 + config.line_search_steps]
    if state.proximal > 0:
        diagnostics["pvi_proximal"] = float(state.proximal)  # the beta of this round's deltas
    if index is None and state.search == 0 and config.adaptive_proximal:
        state = state._replace(proximal=raised_proximal(state.proximal))
        diagnostics["pvi_proximal_next"] = state.proximal
        if config.acceleration == "anderson":  # the fixed-point map changes with beta
            state = state._replace(history=S.restart(state.history))
    if index is None and state.search == 0:
        index = nonmonotone_index(state, config, plain, steps)
        if index is not None:
            diagnostics["pvi_guard"] = (
                f"no step keeps the free energy ({f0:.6g}); non-monotone step {steps[index]:.3g} "
                f"({plain[index]:.6g} >= {min(state.recent):.6g}, the lowest of the last "
                f"{len(state.recent)} rounds)")
            return _finish(state, float(steps[index]), None, float(plain[index]), rejected,
                           complete, diagnostics, config.nonmonotone)
    if index is None:
        if state.search + 1 < config.max_backtracks:
            # no update yet: the next exchange still works towards this update (settled, 0)
            return state._replace(search=state.search + 1), StepInfo(
                rejected=rejected, diagnostics=diagnostics)
        return _finish(state, 0.0, None, float(f0), rejected, complete, {
            **diagnostics, "pvi_guard": f"no step down to {steps[-1]:.3g} keeps the free energy "
                                        f"({f0:.6g}); round rolled back"}, config.nonmonotone)
    step = float(steps[index])
    floor = f0 - config.guard_tolerance * max(1.0, abs(f0))
    if (index > 0 or state.search > 0) and not values[1] >= floor:
        diagnostics["pvi_guard"] = (f"step {round_first_step(state, config):.3g} would lower "
                                    f"the free energy "
                                    f"({f0:.6g}); backtracked to {step:.3g}")
    elif index > 0 or state.search > 0:
        diagnostics["pvi_rule"] = f"step rule {rule!r} took {step:.3g}"
    return _finish(state, step, None, float(values[1 + index]), rejected, complete,
                   diagnostics, config.nonmonotone)


PROXIMAL_MAX = 16.0  # the largest adaptive proximal weight: changes of 1/17 of a full solve


def raised_proximal(beta: float) -> float:
    """``proximal = auto`` after a stalled round: ``1``, then doubled, up to
    :data:`PROXIMAL_MAX`."""
    return float(min(PROXIMAL_MAX, max(1.0, 2.0 * beta)))


def nonmonotone_index(state: ServerState, config: PVIConfig, values: np.ndarray,
                      steps: np.ndarray) -> int | None:
    """The non-monotone fallback (``pvi.nonmonotone``, with ``damping = auto``): the index of the
    largest candidate step at most the last step taken whose free energy ``values`` is at least
    the lowest of the last ``nonmonotone`` rounds' free energies; None when off, with a numeric
    damping (the guard stays strict), before any step was taken, or when no candidate
    qualifies.

    References
    ----------
    Grippo, Lampariello & Lucidi (1986), "A nonmonotone line search technique for Newton's
    method", SIAM J. Numer. Anal. 23(4), eq. (3) (the reference value is the extreme of the last
    ``M`` objective values; here the lowest, for ascent).
    """
    last = state.last_step
    if (not config.auto or config.nonmonotone <= 0 or not state.recent
            or not (np.isfinite(last) and last > 0)):
        return None
    floor = min(state.recent)
    ok = np.flatnonzero(np.isfinite(values) & (values >= floor) & (steps <= last * (1 + 1e-12)))
    return int(ok[0]) if ok.size else None


def _finish(state: ServerState, step: float, anderson: NaturalGaussian | None,
            value: float | None, rejected, complete: bool, diagnostics: dict, window: int):
    """Apply the chosen step (or Anderson's factors; step 0 rolls the round back) and close the
    round; a known free energy joins the non-monotone window of the last ``window`` rounds
    (``pvi.nonmonotone``; 0: none kept)."""
    if anderson is not None:
        factors = anderson
        posterior = _with_factors(state, anderson)
        accepted = tuple(range(state.received.shape[0]))
    elif step > 0:
        factors = G.add(state.factors, G.scale(state.deltas, step))
        posterior = _combined(state, step)
        accepted = tuple(int(k) for k in np.flatnonzero(state.received))
    else:
        factors, posterior, accepted = state.factors, state.posterior, ()
    free_energy = float("nan") if value is None or not complete else value
    diagnostics["pvi_step"] = "anderson" if anderson is not None else step
    recent = state.recent
    if window > 0 and np.isfinite(free_energy):
        recent = (*recent, float(free_energy))[-window:]
    state = state._replace(posterior=posterior, factors=factors, phase=_PHASE_TRAIN, search=0,
                           received=np.zeros_like(state.received), free_energy=free_energy,
                           last_step=state.last_step if anderson is not None or step <= 0
                           else float(step), recent=recent)
    lml = None if np.isnan(free_energy) else free_energy
    return state, StepInfo(updates=1, accepted=accepted, rejected=rejected,
                           metrics={"log_marginal_likelihood": lml}, diagnostics=diagnostics)


def staleness_step(state: ServerState, request_round: int) -> float:
    """Asynchronous ``auto``: the step ``1 / sqrt(1 + tau)`` for a reply computed against the
    posterior of ``tau`` server updates ago (a fresh reply takes the full step).

    An asynchronous server has no free clients to evaluate the free energy, so the step is set
    by staleness, as in staleness-aware asynchronous SGD. On breast-cancer / Dirichlet 0.1 with
    10 clients (seed 0) damping 1 oscillates up to 5 posterior sd away; ``1 / (1 + tau)``
    crawls (0.41 sd after 280 updates); ``1 / sqrt(1 + tau)`` reaches 0.1 sd / 10% after 280
    (260 with three 5x stragglers), against about 190 for hand-tuned damping 0.5. Conjugate
    models converge to the exact posterior: each factor moves a fraction ``s`` of the way to its
    exact value at every visit.

    References
    ----------
    Zhang, Gupta, Lian & Liu (2016), "Staleness-aware Async-SGD for Distributed Deep Learning",
    IJCAI (learning rate divided by the staleness).
    """
    tau = max(0, state.server_round - (int(request_round) - 1))
    return float(1.0 / np.sqrt(1.0 + tau))


def collect_deltas(state: ServerState, replies, config: PVIConfig):
    """Server-held factors, train exchange: keep the round's undamped deltas; the next exchange
    is the step search."""
    rejected, deltas, received = [], _stacked_zeros(state.prior, state.received.shape[0]), \
        np.zeros_like(state.received)
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        deltas.eta1[pid], deltas.eta2[pid] = reply.delta.eta1, reply.delta.eta2
        received[pid] = True
    if config.schedule == "asynchronous":  # one reply: apply it now
        (pid, reply), = replies
        if isinstance(reply, Rejection):
            return state._replace(server_round=state.server_round + 1), StepInfo(
                updates=1, rejected=(reply,), metrics={"log_marginal_likelihood": None})
        step = staleness_step(state, reply.request_round)
        state = state._replace(server_round=state.server_round + 1, deltas=deltas,
                               received=received)
        state = state._replace(factors=G.add(state.factors, G.scale(deltas, step)),
                               posterior=_combined(state, step), received=np.zeros_like(received))
        return state, StepInfo(updates=1, accepted=(pid,), metrics={
            "log_marginal_likelihood": None}, diagnostics={"pvi_step": step})
    state = state._replace(server_round=state.server_round + 1, deltas=deltas, received=received)
    if not received.any():  # nothing to search: the round makes no change
        return state, StepInfo(updates=1, rejected=tuple(rejected), metrics={
            "log_marginal_likelihood": None if np.isnan(state.free_energy) else state.free_energy})
    if config.acceleration == "anderson":
        state = state._replace(history=S.push(state.history, state.factors, deltas))
    # no update yet: the search exchange works towards the same update (settled, 0 updates)
    return state._replace(phase=_PHASE_SEARCH, search=0), StepInfo(rejected=tuple(rejected))


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
    if state.phase == _PHASE_EVALUATE:
        return {pid: Request(EVALUATE, EvalMessage(state.posterior, int(state.accepted_round[pid])))
                for pid in range(setup.num_clients)}
    if state.phase == _PHASE_SEARCH:
        posts = candidates(state, setup.config).posteriors
        message = CandidateMessage(posts.eta1, posts.eta2)
        return {pid: Request(CANDIDATES, message) for pid in range(setup.num_clients)}
    schedule = setup.config.schedule
    if schedule == "asynchronous":
        pids = sorted(rnd.idle)
    else:
        pids = select_clients(setup.run_seed, rnd.number, setup.num_clients, schedule)
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
        if state.phase == _PHASE_SEARCH:
            state, info = search_step(state, replies, config, setup.num_clients,
                                      not _monte_carlo(setup))
        else:
            state, info = collect_deltas(state, replies, config)
        if info.updates and config.optimise_prior:
            state, scale = optimise_prior_scale(state)
            info = info._replace(metrics={**info.metrics, "prior_scale": scale})
        return state, info
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


BUNDLE = Bundle(
    name="pvi", config_class=PVIConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, mode=_mode, corrupt=_corrupt, prior_diag=_prior_diag)


# ---------------------------------------------------------------------------- presets
def _bcm(cavity):
    def preset(c):
        return c.replace(num_rounds=1).with_section(schedule="synchronous", damping=1.0,
                                                     server_damping=1.0, cavity=cavity,
                                                     guard=False, acceleration="none")
    return preset


def _streaming(c):
    return c.replace(num_rounds=c.num_clients).with_section(
        schedule="sequential", damping=1.0, server_damping=1.0, cavity="no-deletion",
        guard=False, acceleration="none")


def _streaming_no_deletion(c):
    return c.with_section(schedule="sequential", damping=1.0, server_damping=1.0,
                          cavity="no-deletion", guard=False, acceleration="none")


def _global_vi(c):  # one client holding all rows: damping would only slow the fit down
    return c.replace(num_clients=1).with_section(schedule="synchronous", damping=1.0,
                                                 server_damping=1.0)


def _global_vi_federated(c):
    return c.with_section(schedule="synchronous", damping=1.0, server_damping=1.0,
                          local_optimiser="fixed-point", fixed_point_iterations=1, guard=False,
                          acceleration="none")


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
