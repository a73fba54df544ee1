"""PVI's settings: :class:`PVIConfig`, the ``[tool.flwr.app.config.pvi]`` section, and its checks.

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning", Section 2.4 (schedules, damping) and Section 3 (cavities of the baselines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedbayes_flwr.algorithms.base import auto_or_number
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.errors import ConfigError

if TYPE_CHECKING:
    from fedbayes_flwr.inference.vi import VIConfig

SCHEDULES = ("synchronous", "sequential", "asynchronous")


CAVITIES = ("pvi", "no-deletion", "same-prior", "split-prior")


LOCAL_OPTIMISERS = ("auto", "adam", "fixed-point")


COVARIANCES = ("auto", "full", "diag")


ACCELERATIONS = ("none", "anderson")


DP_MODES = ("none", "dp-sgd")
DAMPING_FLOOR = 1e-6
"""The smallest damping (and ``damping * server-damping``) accepted: an update moves the factors
that fraction of the way, so below it a run of any practical length stays at the prior."""


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
        at 0.947; ``benchmarks/pvi/pvi_damping.py``).
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
    dp : str
        ``none`` (default: no privacy, the plain PVI above) or ``dp-sgd``: record-level
        differential privacy of everything a client releases, by DP-SGD on its local free
        energy (:func:`fedbayes_flwr.inference.vi.fit_gaussian_dp_sgd`, Heikkila et al. 2023)
        with the privacy spent counted by ``dp-accounting``'s RDP accountant
        (:mod:`fedbayes_flwr.algorithms.pvi.privacy`). A DP run uses client-held factors with
        the numeric ``damping`` (``damping = auto`` is refused: its step search asks every
        client for free energies of its data), the divergence guard and the free-energy query
        are off, every local solve is DP-SGD (``local-optimiser = auto`` or ``adam``;
        ``fixed-point`` is refused, ``closed-form`` does not apply), the asynchronous schedule
        is refused. The expected lot size is ``batch-size`` (Poisson sampling at rate ``q =
        batch-size / n_k``; 0: ``q = 1``, every row in every step).
    dp_clip : float
        ``C`` > 0: the L2 bound of every per-example gradient over all variational parameters
        (``pvi.dp-clip``, default 1.0).
    dp_noise_multiplier : float
        ``sigma`` >= 0: the Gaussian noise added to each step's clipped sum has standard
        deviation ``sigma * C``; 0 (default) calibrates ``sigma`` from ``dp-epsilon`` for the
        planned run.
    dp_epsilon : float
        Target epsilon (0: none). With a calibrated ``sigma`` no client exceeds it over
        ``dp-rounds`` rounds; with a given ``sigma`` the run stops before a round would take a
        client past it.
    dp_delta : float
        ``delta`` in (0, 1), required with ``dp = dp-sgd``: epsilon is reported at this delta
        (pick it below ``1 / n_k``).
    dp_rounds : int
        The rounds the calibration plans for (0: ``num-rounds``; a DP run fills it in, so a
        resumed run keeps its noise).
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
        at ``s = 1/2``. Over 20 synchronous rounds on five seeds (``benchmarks/pvi/pvi_damping.py``) the
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
    dp: str = "none"
    dp_clip: float = 1.0
    dp_noise_multiplier: float = 0.0
    dp_epsilon: float = 0.0
    dp_delta: float = 0.0
    dp_rounds: int = 0

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
    def private(self) -> bool:
        """Whether the run is differentially private (``dp != "none"``)."""
        return self.dp != "none"

    @property
    def server_held(self) -> bool:
        """Whether the run uses server-held factors and the server's step rule: synchronous
        PVI with ``auto`` or the guard. Sequential and asynchronous PVI keep client-held factors
        (``auto`` is damping 1 there: see the module docstring). Never in a DP run: the step
        rule's free energies are queries of the clients' data."""
        if self.private:
            return False
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
            need(value >= DAMPING_FLOOR, key,
                 f"{value:g} is below the floor {DAMPING_FLOOR:g}: an update moves the factors a "
                 f"fraction {value:g} of the way, so {int(0.1 / DAMPING_FLOOR):,} updates would "
                 f"move them less than 10% (the run could not move)")
        need(self.rho * self.server_damping >= DAMPING_FLOOR, "server-damping",
             f"damping * server-damping = {self.rho * self.server_damping:g} is below the floor "
             f"{DAMPING_FLOOR:g} (the run could not move)")
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
        self._validate_dp(need)

    def validate_partitions(self, sizes) -> None:
        """Data-time checks (``sizes``: each partition's training rows): a DP run's expected lot
        ``batch-size`` must fit every client's data (its sampling rate is ``batch-size / n_k``)."""
        if not self.private:
            return
        for pid, n in enumerate(sizes):
            if self.batch_size > int(n):
                raise ConfigError(f"pvi.batch-size: {self.batch_size} is larger than partition "
                                  f"{pid}'s {int(n)} rows (pvi.dp={self.dp} samples each row "
                                  f"with probability batch-size / rows); use at most {int(n)}")

    def _validate_dp(self, need) -> None:
        """The DP keys, and the settings a DP run refuses because they would release data
        without noise (one line each)."""
        need(self.dp in DP_MODES, "dp",
             f"unknown dp mode {self.dp!r}; choose one of {', '.join(DP_MODES)}")
        if not self.private:
            for key, value in (("dp-epsilon", self.dp_epsilon),
                               ("dp-noise-multiplier", self.dp_noise_multiplier)):
                need(value == 0, key, f"set to {value:g} but pvi.dp is 'none' (no privacy); "
                     f"set pvi.dp=dp-sgd")
            return
        need(self.dp_clip > 0, "dp-clip", f"must be > 0, got {self.dp_clip}")
        need(self.dp_noise_multiplier >= 0, "dp-noise-multiplier",
             f"must be >= 0 (0: calibrate from pvi.dp-epsilon), got {self.dp_noise_multiplier}")
        need(self.dp_epsilon >= 0, "dp-epsilon",
             f"must be > 0 (0: no target), got {self.dp_epsilon}")
        need(not (self.dp_epsilon > 0 and self.dp_delta == 0), "dp-epsilon",
             f"a target epsilon {self.dp_epsilon:g} needs pvi.dp-delta in (0, 1)")
        need(0 < self.dp_delta < 1, "dp-delta",
             f"must be in (0, 1) with pvi.dp={self.dp} (epsilon is reported at this delta), "
             f"got {self.dp_delta}")
        need(self.dp_noise_multiplier > 0 or self.dp_epsilon > 0, "dp-noise-multiplier",
             "0 calibrates the noise from pvi.dp-epsilon, which is not set; give one of them")
        need(self.dp_rounds >= 0, "dp-rounds", f"must be >= 0 (0: num-rounds), got {self.dp_rounds}")
        need(self.local_optimiser in ("auto", "adam"), "local-optimiser",
             f"{self.local_optimiser!r} is a deterministic solve on the raw local data; "
             f"pvi.dp={self.dp} trains with DP-SGD (local-optimiser auto or adam)")
        need(not self.auto, "damping",
             f"'auto' searches steps on free energies the clients compute from their data; "
             f"pvi.dp={self.dp} needs a number in (0, 1], e.g. pvi.damping=0.5")
        need(self.schedule != "asynchronous", "schedule",
             f"pvi.dp={self.dp} is accounted per barrier round; use synchronous or sequential")
