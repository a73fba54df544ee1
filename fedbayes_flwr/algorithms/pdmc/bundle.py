"""Fed-PDMC: federated Zig-Zag and bouncy particle samplers as one bundle (seed 003).

Notation: ``U = U_0 + sum_m U_m`` with ``U_m`` worker ``m``'s negative log-likelihood
(:meth:`fedbayes_flwr.models.Model.bounded_potential`) and ``U_0`` the prior's (the model's
Gaussian prior, or flat with ``pdmc.flat-prior``), held by the server as worker 0. ``K`` =
``pdmc.num-chains`` independent chains travel together.

**One exchange = one event per chain** (:mod:`fedbayes_flwr.algorithms.pdmc.sampler`): the server draws its
own next event (prior, refreshment) from the round seed and sends every worker the chains'
positions, velocities and the horizon ``H = min(own time, pdmc.max-horizon)``; each worker
replies its first event time before ``H`` (``+inf`` for none: a valid reply, the codec and the
validation accept it in that field only) and the velocity its event would set; the server takes
the earliest per chain and moves the chains (if nothing happens before ``max-horizon`` they move
that far unchanged). Every exchange counts as one update (``num-rounds`` caps the exchanges; the
presets lift the default cap, the stopping rule below ends the run).

**Output.** The trajectory is sampled every ``pdmc.discretisation`` units of process time (0, the
default: :data:`DISCRETISATION` in the model's coordinates, :data:`DISCRETISATION_Z` in the
preconditioned ones, where one unit of process time moves about one posterior sd); the
first ``pdmc.burn-in`` fraction of each chain's time is discarded at evaluation. The posterior is
a :class:`fedbayes_flwr.inference.posterior.SamplePosterior` with the chains kept apart (ESS and R-hat
across chains, ``tfp.mcmc``); the skeleton (event times, positions, velocities, up to
:data:`SKELETON_CAP` rows) is kept in the state and saved with the samples.

**Stopping.** With ``pdmc.process-time`` ``T > 0`` the run ends when every chain has reached
``T`` (samples beyond ``T`` dropped). Otherwise it ends at the first evaluation point where the
pooled minimum ESS over coordinates reaches ``pdmc.target-ess`` and the largest R-hat is at most
``pdmc.target-rhat`` (0: ESS only), or after ``pdmc.max-seconds`` of
wall time (outcome ``completed`` either way; the diagnostics say which).

**Without rate bounds** (``pdmc.bounds`` ``metropolis``, or ``auto`` for a model without
them): the ``grid`` exchange replaces ``train`` (each worker's first event under its
grid-interpolated rate, plus its share of ``log alpha`` over the previous exchange's piece) and
every ``pdmc.trajectory`` of process time ends with an ``accept`` exchange and a Metropolis step
(:mod:`fedbayes_flwr.algorithms.pdmc.metropolis`); the samples are the chains' states after each
step.

**Failures.** A worker's reply that is missing, NaN, negative, or of the wrong shape is retried
with fresh randomness (``max-retries``); then the run stops with a clear error (policy
``retry-stop``) and the samples and skeleton so far are written. A worker is never dropped: that
would remove ``U_m`` from the target.

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Algorithm 2 and Sections 2.4 (discretisation) and 3; Bierkens, Fearnhead & Roberts (2019), "The
Zig-Zag process and super-efficient sampling for Bayesian analysis of big data";
Bouchard-Cote, Vollmer & Doucet (2018), "The Bouncy Particle Sampler".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, MemoryEstimate, Rejection, Request, StepInfo
from fedbayes_flwr.algorithms.pdmc import metropolis as MH
from fedbayes_flwr.algorithms.pdmc import precondition as PC
from fedbayes_flwr.algorithms.pdmc import privacy
from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import SamplePosterior, TracePosterior
from fedbayes_flwr.inference.potentials import (
    Potential,
    Quadratic,
    cached,
    from_natural,
    precondition,
    recentre,
    tilt,
    to_model,
)
from fedbayes_flwr.inference.sensitivity import clip_features
from fedbayes_flwr.models import make_model, model_spec
from fedbayes_flwr.seeds import derive_seed, numpy_rng

TRAIN = "train"
GRID = "grid"  # pdmc.bounds = metropolis: an exchange under grid-interpolated rates
ACCEPT = "accept"  # ... and the Metropolis exchange ending each trajectory
DISCRETISATION = 0.02  # pdmc.discretisation 0: the sample spacing without a preconditioner
DISCRETISATION_Z = 0.25  # ... and with one (process time in posterior sd: 4 samples per sd)
LAPLACE = "laplace"
LAPLACE_LIMIT = 1e100  # the fit's replies: entries beyond this are refused (PRIOR_SCALE_RANGE's headroom)
START_SCALE = 2.0  # preconditioned chains start from N(0, START_SCALE^2 I) in z: over-dispersed
SKELETON_CAP = 200_000
DEFAULT_EVAL_EVERY = 200
NO_CAP = 10**9


@dataclass(frozen=True)
class PDMCConfig:
    """Fed-PDMC settings: the run-config section ``[tool.flwr.app.config.pdmc]``.

    Attributes
    ----------
    sampler : str
        ``zigzag`` or ``bps``.
    num_chains : int
        ``K`` independent chains advanced by every exchange.
    target_ess : float
        Stop when the pooled minimum ESS over coordinates reaches it (``process-time`` 0).
    target_rhat : float
        ... and the largest R-hat is at most this (0: the ESS alone decides).
    max_seconds : float
        Wall-clock cap of an ESS-targeted run (0 = none): the run's ``max-seconds`` unless that
        is set, so a run that stops there says ``time-limit``, not ``done``.
    process_time : float
        ``T > 0``: run every chain to process time ``T`` instead.
    discretisation : float
        Spacing ``delta`` of the samples taken from the trajectory (0: 0.02 without a
        preconditioner, 0.25 with one).
    burn_in : float
        Fraction of each chain's process time discarded, in ``[0, 1)``.
    refresh_rate : float
        BPS refreshment rate (total, held by the server); ignored by Zig-Zag.
    max_horizon : float
        The longest stretch of process time one exchange searches for events.
    flat_prior : bool
        Use the flat (Lebesgue) prior ``U_0 = 0`` instead of the model's Gaussian prior.
    dp_epsilon : float
        Zig-Zag only: each worker adds ``rho`` to every coordinate rate so that each released
        proposal is ``dp-epsilon``-DP (0 = off; :mod:`fedbayes_flwr.algorithms.pdmc.privacy`, a bound
        derived here, not quoted from the paper).
    dp_delta : float
        0: pure DP over the window ``max-horizon``; > 0: ``(epsilon, delta)``-DP.
    dp_feature_clip : float
        The public bound on ``|features|`` (rows are clipped to it when DP is on); it bounds the
        sensitivity of logistic regression's rates.
    preconditioner : str
        ``none``, ``diagonal``, ``dense`` or ``auto``: sample ``z`` with ``x = m + L z`` agreed by
        every worker, ``m`` and ``L`` from a federated Laplace fit before the first event
        (:mod:`fedbayes_flwr.algorithms.pdmc.precondition`; ``auto``: dense up to
        ``d = 100``, diagonal above, none with ``dp-epsilon``).
    laplace_steps : int
        The most exchanges the Laplace fit may take (Newton steps and halvings).
    bounds : str
        ``exact`` (thinning with the model's rate bounds), ``metropolis`` (no bounds:
        grid-interpolated rates and a Metropolis step per trajectory,
        :mod:`fedbayes_flwr.algorithms.pdmc.metropolis`) or ``auto`` (exact when the model has
        rate bounds, else metropolis).
    trajectory : float
        Metropolis: the process time of one trajectory (rounded up to a multiple of
        ``rate-grid``), in the sampler's coordinates; one sample per trajectory.
    rate_grid : float
        Metropolis: the grid step ``h`` of the interpolated rates (one gradient per cell; 0.5
        from ``benchmarks/pdmc/metropolis.py``).
    """

    sampler: str = "zigzag"
    num_chains: int = 16
    target_ess: float = 400.0
    target_rhat: float = 1.01
    max_seconds: float = 110.0
    process_time: float = 0.0
    discretisation: float = 0.0
    burn_in: float = 0.1
    refresh_rate: float = 1.0
    max_horizon: float = 1.0
    flat_prior: bool = False
    dp_epsilon: float = 0.0
    dp_delta: float = 0.0
    dp_feature_clip: float = 1.0
    preconditioner: str = "auto"
    laplace_steps: int = 30
    bounds: str = "auto"
    trajectory: float = 1.0
    rate_grid: float = 0.5

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""

        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"pdmc.{key}: {msg}")

        need(self.sampler in S.SAMPLERS, "sampler",
             f"unknown sampler {self.sampler!r}; choose one of {', '.join(S.SAMPLERS)}")
        need(self.num_chains >= 1, "num-chains", f"must be >= 1, got {self.num_chains}")
        need(self.target_ess > 0, "target-ess", f"must be > 0, got {self.target_ess}")
        need(self.max_seconds >= 0, "max-seconds", f"must be >= 0, got {self.max_seconds}")
        need(self.process_time >= 0, "process-time", f"must be >= 0, got {self.process_time}")
        need(self.discretisation >= 0, "discretisation",
             f"must be > 0 (0 = auto), got {self.discretisation}")
        need(self.target_rhat == 0 or self.target_rhat > 1, "target-rhat",
             f"must be > 1 (0 = off), got {self.target_rhat}")
        need(0 <= self.burn_in < 1, "burn-in", f"must be in [0, 1), got {self.burn_in}")
        need(self.refresh_rate >= 0, "refresh-rate", f"must be >= 0, got {self.refresh_rate}")
        need(self.max_horizon > 0, "max-horizon", f"must be > 0, got {self.max_horizon}")
        need(self.dp_epsilon >= 0, "dp-epsilon", f"must be >= 0 (0 = off), got {self.dp_epsilon}")
        need(0 <= self.dp_delta < 1, "dp-delta", f"must be in [0, 1), got {self.dp_delta}")
        need(self.dp_feature_clip > 0, "dp-feature-clip",
             f"must be > 0, got {self.dp_feature_clip}")
        need(self.preconditioner in PC.KINDS, "preconditioner",
             f"unknown preconditioner {self.preconditioner!r}; choose one of "
             f"{', '.join(PC.KINDS)}")
        need(self.laplace_steps >= 1, "laplace-steps", f"must be >= 1, got {self.laplace_steps}")
        need(self.dp_epsilon == 0 or self.preconditioner in ("none", "auto"), "preconditioner",
             f"{self.preconditioner!r} with dp-epsilon: the Laplace fit releases gradients and "
             f"Hessians the privacy bound does not cover (use none or auto)")
        need(self.bounds in MH.BOUNDS, "bounds",
             f"unknown bounds {self.bounds!r}; choose one of {', '.join(MH.BOUNDS)}")
        need(self.trajectory > 0, "trajectory", f"must be > 0, got {self.trajectory}")
        need(self.rate_grid > 0, "rate-grid", f"must be > 0, got {self.rate_grid}")
        need(self.dp_epsilon == 0 or self.bounds != "metropolis", "bounds",
             "metropolis with dp-epsilon: the privacy analysis assumes exact thinning of "
             "bounded rates (use exact or auto with a model that has rate bounds)")
        if getattr(model_spec(run.model), "structured", False):
            return  # the generic check names the right family
        model = make_model(run.model, run.noise_scale)
        kind = MH.resolve(self.bounds, model.has_bounded_potential())
        if kind == "exact" and not model.has_bounded_potential():
            raise ConfigError(f"model: PDMC needs rate bounds for the model's likelihood with "
                              f"pdmc.bounds={self.bounds}; {run.model!r} has none "
                              f"(gaussian-mean, logistic-regression, ar1-student-t do; a "
                              f"LikelihoodModel needs rate_bound=, its Hessian bounds), or use "
                              f"pdmc.bounds=metropolis")
        if kind == "metropolis" and not model.has_gradient_potential():
            raise ConfigError(f"model: pdmc.bounds=metropolis needs the likelihood's gradient; "
                              f"{run.model!r} has no numpy potential")
        if kind == "metropolis" and self.dp_epsilon > 0:
            raise ConfigError(f"pdmc.dp-epsilon: {run.model!r} has no rate bounds, so "
                              f"pdmc.bounds=auto is metropolis, which the privacy analysis "
                              f"(exact thinning) does not cover")
        if self.dp_epsilon > 0:
            try:
                privacy.check_sampler(self.sampler)
            except ValueError as err:
                raise ConfigError(f"pdmc.dp-epsilon: {err}") from None

    def validate_setup(self, setup) -> None:
        """The checks that need the parameter dimension (the experiment hands it in once the data
        are loaded): a privacy target the refreshment can reach with this model and dimension."""
        if self.dp_epsilon > 0:
            try:
                dp_rho(self, setup.model, setup.prior.dim)
            except (ValueError, NotImplementedError) as err:
                raise ConfigError(f"pdmc.dp-epsilon: {err}") from None


# a worker's velocity may be this much longer (relative) than the one sent: a reflection
# v - 2 (v.g) g / |g|^2 keeps |v| up to a few ulps
SPEED_RTOL = 1e-9

class ServerState(NamedTuple):
    """Chains, counters, samples and skeleton (module docstring)."""

    x: np.ndarray
    v: np.ndarray
    t: np.ndarray
    events: np.ndarray
    winners: np.ndarray
    grad_evals: int
    exchanges: int
    next_sample: np.ndarray
    sample_chain: np.ndarray
    sample_time: np.ndarray
    samples: np.ndarray
    skeleton_chain: np.ndarray
    skeleton_time: np.ndarray
    skeleton_x: np.ndarray
    skeleton_v: np.ndarray
    started: float
    shift: np.ndarray
    scale: np.ndarray
    laplace: PC.Laplace
    fitting: bool
    clock: np.ndarray  # metropolis: each chain's process time within its trajectory
    x0: np.ndarray  # ... the trajectory's start
    v0: np.ndarray
    log_alpha: np.ndarray  # ... the workers' shares of log alpha so far
    last: Prev  # ... the last exchange's pieces, sent with the next exchange
    accepting: bool  # ... the next exchange is the Metropolis one
    accepted: int
    trajectories: int


class ClientState(NamedTuple):
    """Workers keep nothing between events."""

    empty: np.ndarray


class Down(NamedTuple):
    """Chains' positions and velocities in the sampler's coordinates ``z``, the horizon, and the
    agreed map ``x = shift + scale z`` (``scale`` ``(d, d)``, its diagonal ``(d,)``, or size 0
    for none)."""

    x: np.ndarray
    v: np.ndarray
    horizon: np.ndarray
    number: int
    shift: np.ndarray
    scale: np.ndarray


class Prev(NamedTuple):
    """Metropolis: the previous exchange's piece per chain (start, velocity, clock, length) and
    its event (the velocity after, the winner: -1 none, 0 the server, ``m`` worker ``m``)."""

    x: np.ndarray
    v: np.ndarray
    clock: np.ndarray
    tau: np.ndarray
    after: np.ndarray
    winner: np.ndarray


class GridDown(NamedTuple):
    """Metropolis: :class:`Down` plus each chain's trajectory clock and the previous piece
    (each worker adds its share of the path-density ratio over it)."""

    x: np.ndarray
    v: np.ndarray
    clock: np.ndarray
    horizon: np.ndarray
    prev: Prev
    number: int
    shift: np.ndarray
    scale: np.ndarray


class GridUp(NamedTuple):
    """Event times (``+inf``: none), velocities, the share of ``log alpha`` over the previous
    piece (``-inf``: a reversed event of rate 0), gradient evaluations."""

    tau: np.ndarray
    velocity: np.ndarray
    term: np.ndarray
    grad_evals: int
    number: int


class AcceptDown(NamedTuple):
    """Metropolis: the trajectory's start and end and its last piece."""

    x0: np.ndarray
    x1: np.ndarray
    prev: Prev
    number: int
    shift: np.ndarray
    scale: np.ndarray


class AcceptUp(NamedTuple):
    """The worker's last share of ``log alpha``: ``-(U_m(x_T) - U_m(x_0))`` plus the last piece."""

    term: np.ndarray
    grad_evals: int
    number: int


class LaplaceDown(NamedTuple):
    """The Laplace fit's trial point."""

    point: np.ndarray
    number: int


class LaplaceUp(NamedTuple):
    """``U_m``, its gradient and Hessian at the trial point, and their cost in gradients."""

    value: float
    grad: np.ndarray
    hess: np.ndarray
    grad_evals: int
    number: int


class Up(NamedTuple):
    """Event times (``+inf``: none before the horizon), new velocities, gradient evaluations."""

    tau: np.ndarray
    velocity: np.ndarray
    grad_evals: int
    number: int


# ---------------------------------------------------------------------------- the pieces
def prior_potential(setup) -> Quadratic:
    """``U_0``: the model's Gaussian prior (precision and mean), or flat."""
    d = setup.prior.dim
    if setup.config.flat_prior:
        return Quadratic(np.zeros((d, d)), np.zeros(d))
    return from_natural(setup.prior)


def dp_rho(config: PDMCConfig, model, param_dim: int) -> float:
    """The per-coordinate rate ``rho`` every worker adds for ``dp-epsilon`` (0 when off).

    Raises ``ValueError`` (e.g. :class:`fedbayes_flwr.inference.sensitivity.UnboundedSensitivityError`)
    when the model's sensitivity is unbounded or the target cannot be reached."""
    if config.dp_epsilon <= 0:
        return 0.0

    sensitivity = model.rate_sensitivity(config.dp_feature_clip, param_dim)
    return float(privacy.refresh_for_epsilon(config.dp_epsilon, sensitivity, dim=None,
                                             horizon=config.max_horizon, delta=config.dp_delta))


def dp_report(config: PDMCConfig, model, param_dim: int, releases: int) -> dict:
    """``dp_rho``, the per-release guarantee and its basic composition over ``releases``."""

    rho = dp_rho(config, model, param_dim)
    sensitivity = model.rate_sensitivity(config.dp_feature_clip, param_dim)
    one = privacy.privacy_of(rho, sensitivity, dim=None, horizon=config.max_horizon,
                             delta=config.dp_delta)
    total = privacy.compose(one.epsilon, releases, per_event_delta=one.delta)
    return {"dp_rho": rho, "dp_epsilon_per_release": one.epsilon,
            "dp_delta_per_release": one.delta, "dp_releases_per_worker": releases,
            "dp_epsilon_total": total.epsilon, "dp_delta_total": total.delta}


def worker_potential(model, data, shift=None, scale=None):
    """``U_m`` of a worker's rows (in ``z`` when a transform is given: its bounds are built
    once per transform), cached by the rows' content (built once per worker, not once per
    event). A model without rate bounds gives its gradient potential (Metropolis PDMC)."""
    build = model.bounded_potential if model.has_bounded_potential() else \
        model.gradient_potential
    base = cached(("pdmc", id(model)), data, lambda: build(data.x, data.y))
    if scale is None or scale.size == 0:
        return base
    return cached(("pdmc", id(model), _digest(shift, scale)), data,
                  lambda: precondition(recentre(base, shift), shift, scale))


def _digest(shift: np.ndarray, scale: np.ndarray) -> str:
    import hashlib

    h = hashlib.blake2b(np.ascontiguousarray(shift).tobytes(), digest_size=16)
    h.update(np.ascontiguousarray(scale).tobytes())
    h.update(str(scale.shape).encode())
    return h.hexdigest()


_PRIOR_Z: dict = {}


def sampler_prior(state: ServerState, setup):
    """``U_0`` in the sampler's coordinates (the model's when no transform), with the
    re-centred split's tilt ``sum_m grad U_m(m) . x`` (:func:`.precondition.split_at_mode`; the
    total gradient at ``m`` is the fit's last)."""
    prior = prior_potential(setup)
    if state.scale.size == 0:
        return prior
    # keyed on everything the result depends on (not on object ids, which Python reuses)
    key = (_digest(state.shift, state.scale), _digest(state.laplace.grad, prior.hessian),
           prior.centre.tobytes())
    if key not in _PRIOR_Z:
        if len(_PRIOR_Z) > 64:
            _PRIOR_Z.clear()
        offsets = state.laplace.grad - prior.grad(state.shift[None])[0]
        _PRIOR_Z[key] = precondition(tilt(prior, offsets), state.shift, state.scale)
    return _PRIOR_Z[key]


def discretisation(setup) -> float:
    """``pdmc.discretisation``, or its automatic value (0: module docstring)."""
    c = setup.config
    if c.discretisation > 0:
        return c.discretisation
    return DISCRETISATION if preconditioner_kind(setup) == "none" else DISCRETISATION_Z


def preconditioner_kind(setup) -> str:
    """The resolved ``pdmc.preconditioner`` (``auto`` decided by dimension, DP and bounds)."""
    c = setup.config
    return PC.resolve(c.preconditioner, setup.prior.dim, c.dp_epsilon > 0,
                      bounds_kind(setup) == "metropolis")


def bounds_kind(setup) -> str:
    """The resolved ``pdmc.bounds`` (``auto``: exact when the model has rate bounds)."""
    return MH.resolve(setup.config.bounds, setup.model.has_bounded_potential())


def trajectory_length(setup) -> float:
    """``pdmc.trajectory`` rounded up to a multiple of ``pdmc.rate-grid``."""
    c = setup.config
    return float(np.ceil(c.trajectory / c.rate_grid - 1e-9) * c.rate_grid)


def _mine(prev: Prev, pid: int) -> Prev:
    """The previous piece as worker ``pid`` gets it: ``winner`` 1 where its event (worker
    ``pid + 1`` of the combine: every worker replies, none is dropped), else -1."""
    return prev._replace(winner=np.where(prev.winner == pid + 1, 1, -1).astype(np.int64))


def _no_prev(k: int, d: int) -> Prev:
    z = np.zeros((k, d))
    return Prev(z, z.copy(), np.zeros(k), np.zeros(k), z.copy(), np.full(k, -1, np.int64))


def _hessian_at(pot, point):
    """The Hessian and its cost; by polarisation of ``hess_quad`` for potentials without one."""
    if hasattr(pot, "hessian_at"):
        return pot.hessian_at(point)
    return Potential.hessian_at(pot, point)


def _to_model(state: ServerState, z: np.ndarray) -> np.ndarray:
    """Sampler coordinates to the model's (during the fit the chains are still in the model's)."""
    return z if state.scale.size == 0 or state.fitting else to_model(z, state.shift, state.scale)


def _velocity_to_model(state: ServerState, w: np.ndarray) -> np.ndarray:
    return w if state.scale.size == 0 else to_model(w, 0.0, state.scale)


def _dp_data(data, config: PDMCConfig):
    """With DP on, the rows clipped to the public feature bound (the sensitivity assumes it)."""
    if config.dp_epsilon <= 0:
        return data

    return data._replace(x=clip_features(data.x, config.dp_feature_clip))


def _own_proposal(state: ServerState, setup, rnd) -> S.Proposal:
    c = setup.config
    rng = numpy_rng(derive_seed(setup.run_seed, "pdmc.server", rnd.number, -1, rnd.step))
    return S.server_proposal(sampler_prior(state, setup), c.sampler, state.x, state.v,
                             c.refresh_rate if c.sampler == "bps" else 0.0, c.max_horizon, rng)


def _empty(d: int):
    return (np.zeros(0, np.int64), np.zeros(0), np.zeros((0, d)))


# ---------------------------------------------------------------------------- bundle functions
def _init_server(setup) -> ServerState:
    c = setup.config
    d, k = setup.prior.dim, c.num_chains
    rng = numpy_rng(derive_seed(setup.run_seed, "pdmc.init", 0, -1))
    mean, cov = G.to_moments(setup.prior)
    cov = np.diag(cov) if setup.prior.is_diag else cov
    x = rng.multivariate_normal(mean, cov, size=k)  # over-dispersed for a concentrated posterior
    v = S.initial_velocity(c.sampler, rng, k, d)
    chain, times, points = _empty(d)
    scale = _scale_template(setup)  # zeros until the fit ends (of the final shape: checkpoints)
    shift = np.zeros(0 if scale.size == 0 else d)
    return ServerState(x, v, np.zeros(k), np.zeros(k, np.int64),
                       np.zeros(setup.num_clients + 1, np.int64), 0, 0, np.zeros(k), chain, times,
                       points, chain.copy(), times.copy(), points.copy(), points.copy(),
                       time.time(), shift, scale, PC.start(mean), scale.size > 0,
                       np.zeros(k), x.copy(), v.copy(), np.zeros(k), _no_prev(k, d), False, 0, 0)


def _init_client(setup, partition_id: int) -> ClientState:
    return ClientState(np.zeros(0))


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    if state.fitting:
        fit = LaplaceDown(state.laplace.trial, rnd.number)
        return {pid: Request(LAPLACE, fit) for pid in range(setup.num_clients)}
    if state.accepting:
        return {pid: Request(ACCEPT, AcceptDown(state.x0, state.x, _mine(state.last, pid),
                                                rnd.number, state.shift, state.scale))
                for pid in range(setup.num_clients)}
    own = _own_proposal(state, setup, rnd)
    horizon = np.minimum(own.tau, setup.config.max_horizon)
    if bounds_kind(setup) == "metropolis":
        horizon = np.minimum(horizon, np.maximum(trajectory_length(setup) - state.clock, 0.0))
        if setup.config.process_time > 0 and np.all(state.t >= setup.config.process_time):
            horizon = np.zeros_like(horizon)  # the run is over (the engine ends it at the check)
        return {pid: Request(GRID, GridDown(state.x, state.v, state.clock, horizon,
                                            _mine(state.last, pid), rnd.number, state.shift,
                                            state.scale))
                for pid in range(setup.num_clients)}
    down = Down(state.x, state.v, horizon, rnd.number, state.shift, state.scale)
    return {pid: Request(TRAIN, down) for pid in range(setup.num_clients)}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    msg, config = request.message, setup.config
    if request.action == LAPLACE:
        pot = worker_potential(setup.model, data)
        point = np.asarray(msg.point, dtype=np.float64)
        hess, cost = _hessian_at(pot, point)
        return state, LaplaceUp(float(pot.value(point[None])[0]), pot.grad(point[None])[0],
                                np.asarray(hess, dtype=np.float64), 1 + int(cost),
                                msg.number), {}
    if request.action in (GRID, ACCEPT):
        return state, _metropolis_step(seed, msg, request.action, data, setup), {}
    rho = dp_rho(config, setup.model, setup.prior.dim)
    pot = worker_potential(setup.model, _dp_data(data, config), msg.shift, msg.scale)
    proposal = S.propose(pot, config.sampler, msg.x, msg.v, msg.horizon, numpy_rng(seed),
                         rate_shift=rho)
    # with DP on, the number of rejected candidates (data-dependent) is not released
    evals = 0 if rho > 0 else int(proposal.grad_evals)
    return state, Up(proposal.tau, proposal.velocity, evals, msg.number), {}


def _metropolis_step(seed, msg, action: str, data, setup):
    """A worker's reply under ``pdmc.bounds = metropolis`` (:mod:`.metropolis`): its share of
    ``log alpha`` over the previous piece (and, ending a trajectory, ``-(U_m(x_T) - U_m(x_0))``),
    plus (``grid``) its first event under the grid-interpolated rate."""
    c = setup.config
    pot = worker_potential(setup.model, data, msg.shift, msg.scale)
    p = msg.prev
    k = p.x.shape[0]
    term, evals = MH.path_terms(pot, c.sampler, MH.piece(p.x, p.v, p.clock, p.tau, p.after,
                                                         p.winner), c.rate_grid, 1, k)
    if action == ACCEPT:
        return AcceptUp(term + MH.end_terms(pot, msg.x0, msg.x1), evals + 2 * k, msg.number)
    prop = MH.propose(pot, c.sampler, msg.x, msg.v, msg.clock, msg.horizon, c.rate_grid,
                      numpy_rng(seed))
    return GridUp(prop.tau, prop.velocity, term, evals + int(prop.grad_evals), msg.number)


def _server_step(state: ServerState, replies, setup, rnd):
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    if rejected:  # retry-stop: never reached with a missing worker (the engines stop first)
        raise RuntimeError(f"pdmc: {len(rejected)} worker replies missing; a worker cannot be "
                           f"dropped")
    c = setup.config
    good = sorted(replies, key=lambda item: item[0])
    if state.fitting:
        return _fit_step(state, setup, rnd, good)
    if bounds_kind(setup) == "metropolis":
        return _metropolis_server(state, setup, rnd, good)
    own = _own_proposal(state, setup, rnd)
    workers = [S.Proposal(r.tau, r.velocity, r.grad_evals) for _, r in good]
    tau, velocity, winner = S.combine(own, workers, c.max_horizon)
    if c.process_time > 0:  # never move past T
        tau = np.minimum(tau, np.maximum(c.process_time - state.t, 0.0))
    rows, times, points, next_sample = S.discretise(state.x, state.v, state.t, tau,
                                                    state.next_sample, discretisation(setup))
    x = state.x + state.v * tau[:, None]
    moved = tau > 0
    event = (winner >= 0) & moved
    v = np.where(event[:, None], velocity, state.v)
    t = state.t + tau
    winners = state.winners + np.bincount(winner[event], minlength=state.winners.size)
    skel = [state.skeleton_chain, state.skeleton_time, state.skeleton_x, state.skeleton_v]
    if state.skeleton_chain.size < SKELETON_CAP and np.any(event):
        hit = np.flatnonzero(event)  # kept in the model's coordinates
        skel = [np.concatenate([skel[0], hit]), np.concatenate([skel[1], t[hit]]),
                np.concatenate([skel[2], _to_model(state, x[hit])]),
                np.concatenate([skel[3], _velocity_to_model(state, v[hit])])]
    grad_evals = state.grad_evals + sum(int(r.grad_evals) for _, r in good) + own.grad_evals
    new = ServerState(x, v, t, state.events + event, winners, grad_evals, state.exchanges + 1,
                      next_sample, np.concatenate([state.sample_chain, rows]),
                      np.concatenate([state.sample_time, times]),
                      np.concatenate([state.samples, _to_model(state, points)]), *skel,
                      state.started, state.shift, state.scale, state.laplace, False,
                      *state[-8:])  # the Metropolis fields, unused here
    return new, _info(new, setup, rnd, good)


def _metropolis_server(state: ServerState, setup, rnd, good):
    """``pdmc.bounds = metropolis`` at the server (:mod:`.metropolis`): an exchange moves the
    chains to their earliest event under the workers' grid rates (the prior's and refreshment
    exact) and adds the workers' shares of ``log alpha`` over the previous piece; once every
    chain has run the trajectory, the Metropolis exchange adds the last shares and accepts
    ``(x_T, v_T)`` or returns to ``(x_0, -v_0)``: that state is the sample."""
    c = setup.config
    k, d = state.x.shape
    log_alpha = state.log_alpha + sum(np.asarray(r.term, dtype=np.float64) for _, r in good)
    grad_evals = state.grad_evals + sum(int(r.grad_evals) for _, r in good)
    length = trajectory_length(setup)
    if c.process_time > 0 and np.all(state.t >= c.process_time):  # the run is over: stay
        return state._replace(exchanges=state.exchanges + 1), _info(state, setup, rnd, good)
    if state.accepting:
        rng = numpy_rng(derive_seed(setup.run_seed, "pdmc.accept", rnd.number, -1, rnd.step))
        accept = np.log(rng.random(k)) < log_alpha
        x = np.where(accept[:, None], state.x, state.x0)
        v = np.where(accept[:, None], state.v, -state.v0)
        t = state.t + length
        new = state._replace(
            x=x, v=v, t=t, grad_evals=grad_evals, exchanges=state.exchanges + 1,
            sample_chain=np.concatenate([state.sample_chain, np.arange(k)]),
            sample_time=np.concatenate([state.sample_time, t]),
            samples=np.concatenate([state.samples, _to_model(state, x)]),
            clock=np.zeros(k), x0=x.copy(), v0=v.copy(), log_alpha=np.zeros(k),
            last=_no_prev(k, d), accepting=False, accepted=state.accepted + int(accept.sum()),
            trajectories=state.trajectories + 1)
        return new, _info(new, setup, rnd, good)
    own = _own_proposal(state, setup, rnd)
    workers = [S.Proposal(r.tau, r.velocity, r.grad_evals) for _, r in good]
    tau, velocity, winner = S.combine(own, workers, c.max_horizon)
    left = np.maximum(length - state.clock, 0.0)
    tau = np.minimum(tau, left)
    event = (winner >= 0) & (tau > 0) & (tau < left)
    x = state.x + state.v * tau[:, None]
    v = np.where(event[:, None], velocity, state.v)
    clock = np.where(tau >= left, length, state.clock + tau)
    winners = state.winners + np.bincount(winner[event], minlength=state.winners.size)
    last = Prev(state.x, state.v, state.clock, tau, v, np.where(event, winner, -1))
    new = state._replace(x=x, v=v, events=state.events + event, winners=winners,
                         grad_evals=grad_evals + own.grad_evals,
                         exchanges=state.exchanges + 1, clock=clock, log_alpha=log_alpha,
                         last=last, accepting=bool(np.all(clock >= length)))
    return new, _info(new, setup, rnd, good)


def _info(state: ServerState, setup, rnd, good) -> StepInfo:
    info = StepInfo(updates=1, accepted=tuple(pid for pid, _ in good))
    if rnd.evaluate:
        info = info._replace(metrics=_metrics(state, setup),
                             diagnostics=_diagnostics(state, setup))
    return info


def _fit_step(state: ServerState, setup, rnd, good):
    """One exchange of the Laplace fit (:mod:`.precondition`): the workers' ``U_m``, gradients
    and Hessians at the trial point plus the prior's; when it finishes, the transform and the
    chains' start in ``z`` (``N(0, START_SCALE^2 I)``, velocities drawn afresh)."""
    c = setup.config
    prior = prior_potential(setup)
    trial = state.laplace.trial
    value = float(prior.value(trial[None])[0]) + sum(float(r.value) for _, r in good)
    grad = prior.grad(trial[None])[0] + sum(r.grad for _, r in good)
    hess = prior.hessian + sum(r.hess for _, r in good)
    fit, done = PC.newton_update(state.laplace, value, grad, hess, c.laplace_steps)
    grad_evals = state.grad_evals + sum(int(r.grad_evals) for _, r in good)
    new = state._replace(grad_evals=grad_evals, exchanges=state.exchanges + 1, laplace=fit)
    if done:
        k, d = state.x.shape
        rng = numpy_rng(derive_seed(setup.run_seed, "pdmc.start", 0, -1))
        z = START_SCALE * rng.standard_normal((k, d))
        v = S.initial_velocity(c.sampler, rng, k, d)
        new = new._replace(x=z, v=v, x0=z.copy(), v0=v.copy(), fitting=False,
                           shift=fit.point.copy(),
                           scale=PC.transform(preconditioner_kind(setup), fit.hess))
    return new, _info(new, setup, rnd, good)


def kept_chains(state: ServerState, setup) -> np.ndarray:
    """``(K, S, d)`` samples after burn-in (and up to ``process-time``), equal lengths."""
    c = setup.config
    k, d = state.x.shape
    start = c.burn_in * state.t  # per chain: the first fraction of its own time
    keep = state.sample_time >= start[state.sample_chain]
    if c.process_time > 0:
        keep &= state.sample_time <= c.process_time
    per = [state.samples[keep & (state.sample_chain == j)] for j in range(k)]
    n = min(len(p) for p in per)
    if n == 0:
        return np.repeat(_to_model(state, state.x)[:, None, :], 1, axis=1)
    return np.stack([p[:n] for p in per])


def _metrics(state: ServerState, setup) -> dict:
    time_total = float(state.t.sum())
    out = {"process_time": float(state.t.mean()), "events": int(state.events.sum()),
           "switching_rate": float(state.events.sum() / time_total) if time_total else 0.0,
           "grad_evals": int(state.grad_evals),
           "wall_s": round(time.time() - state.started, 3)}
    if setup.config.dp_epsilon > 0:  # every reply of every chain is a release, "none" included
        out.update(dp_report(setup.config, setup.model, setup.prior.dim,
                             state.exchanges * setup.config.num_chains))
    return out


def _diagnostics(state: ServerState, setup) -> dict:
    out = {"exchanges": int(state.exchanges),
           "events_by_worker": [int(w) for w in state.winners],
           "samples_per_chain": int(kept_chains(state, setup).shape[1]),
           "preconditioner": preconditioner_kind(setup),
           "laplace_exchanges": int(state.laplace.steps), "bounds": bounds_kind(setup)}
    if out["bounds"] == "metropolis":
        out["trajectories"] = int(state.trajectories)
        out["acceptance"] = (float(state.accepted / (state.trajectories * state.x.shape[0]))
                             if state.trajectories else 1.0)
    return out


def _posterior(state: ServerState, setup):
    return TracePosterior(kept_chains(state, setup), extras={
        "skeleton_chain": state.skeleton_chain, "skeleton_time": state.skeleton_time,
        "skeleton_x": state.skeleton_x, "skeleton_v": state.skeleton_v},
        counts={"grad_evals": float(state.grad_evals), "events": float(state.events.sum())})


def _done(state: ServerState, setup) -> bool:
    c = setup.config
    if c.process_time > 0:
        return bool(np.all(state.t >= c.process_time))
    # the wall-clock cap is the run's max-seconds (preset), so a run ending there says
    # "time-limit", not "done" (the target ESS was not reached)
    chains = kept_chains(state, setup)
    if chains.shape[1] < 20:
        return False

    post = SamplePosterior(chains)
    if np.min(post.ess()) < c.target_ess:
        return False
    if c.target_rhat == 0 or chains.shape[0] < 2:  # R-hat needs two chains
        return True
    return bool(np.max(post.rhat()) <= c.target_rhat)


def _scale_template(setup) -> np.ndarray:
    d = setup.prior.dim
    return {"none": np.zeros(0), "diagonal": np.zeros(d),
            "dense": np.zeros((d, d))}[preconditioner_kind(setup)]


def _actions(setup) -> dict[str, ActionSpec]:
    k, d = setup.config.num_chains, setup.prior.dim
    z = np.zeros((k, d))
    scale = _scale_template(setup)
    shift = np.zeros(0 if scale.size == 0 else d)
    out = {TRAIN: ActionSpec("train", Down(z, z, np.zeros(k), 0, shift, scale),
                             Up(np.zeros(k), z, 0, 0), allow_inf=frozenset({"tau"}))}
    if bounds_kind(setup) == "metropolis":
        prev = _no_prev(k, d)
        out[GRID] = ActionSpec("train", GridDown(z, z, np.zeros(k), np.zeros(k), prev, 0, shift,
                                                 scale),
                               GridUp(np.zeros(k), z, np.zeros(k), 0, 0),
                               allow_inf=frozenset({"tau", "term"}))
        out[ACCEPT] = ActionSpec("train", AcceptDown(z, z, prev, 0, shift, scale),
                                 AcceptUp(np.zeros(k), 0, 0), allow_inf=frozenset({"term"}))
    if scale.size:
        out[LAPLACE] = ActionSpec("train", LaplaceDown(np.zeros(d), 0),
                                  LaplaceUp(0.0, np.zeros(d), np.zeros((d, d)), 0, 0))
    return out


def _client_state_template(setup) -> ClientState:
    return ClientState(np.zeros(0))


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """Event times ``> 0`` (``+inf`` allowed), velocities of the sampler's kind and of the speed
    sent (a reflection keeps it), this exchange."""
    if reply.number != state.exchanges + 1:
        return "number", f"answers exchange {reply.number}, expected {state.exchanges + 1}"
    if reply.grad_evals < 0:
        return "grad_evals", f"must be >= 0, got {reply.grad_evals}"
    if action == LAPLACE:  # U_m, its gradient and Hessian: finite (generic) and not absurd
        for field in ("value", "grad", "hess"):
            big = float(np.max(np.abs(getattr(reply, field))))
            if big > LAPLACE_LIMIT:
                return field, (f"|{field}| reaches {big:.3g}, beyond the limit "
                               f"{LAPLACE_LIMIT:g} (no data term of a float64 model gets there)")
        return None
    if action in (GRID, ACCEPT) and np.any(reply.term == np.inf):  # -inf: a reversed rate 0
        return "term", "a share of log alpha cannot be +inf"
    if action == ACCEPT:
        return None
    if np.any(reply.tau <= 0):
        return "tau", f"event times must be > 0, smallest {float(reply.tau.min()):.4g}"
    if reply.grad_evals < 0:
        return "grad_evals", f"must be >= 0, got {reply.grad_evals}"
    if setup.config.sampler == "zigzag" and not np.all(np.abs(reply.velocity) == 1.0):
        return "velocity", "Zig-Zag velocities must be +-1"
    # a worker's event reflects (BPS) or flips (Zig-Zag) v: the speed is kept, to rounding
    speed, sent = np.linalg.norm(reply.velocity, axis=-1), np.linalg.norm(state.v, axis=-1)
    if speed.shape == sent.shape and np.any(speed > sent * (1.0 + SPEED_RTOL)):
        return "velocity", (f"speed {float(np.max(speed / sent)):.3g} times the one sent (limit "
                            f"1 + {SPEED_RTOL:g}: an event reflects or flips the velocity, "
                            f"keeping its length)")
    return None


def _corrupt(kind: str, reply, request: Request):
    """``negative-precision`` has no meaning here; ``nan`` is generic."""
    raise ValueError(f"PDMC cannot make a {kind!r} fault")


def _prior_diag(config: PDMCConfig, model) -> bool:
    return True


def _memory_estimate(setup) -> MemoryEstimate:
    """The rate bounds PDMC's workers hold: each worker's and the prior's potential keeps a
    ``d x d`` Hessian bound and its absolute value, ``2 (K + 1) d^2`` float64s (twice that with
    a preconditioner: the bounds in ``z`` too), plus ``8 C d``
    for the chains' positions, velocities and proposals (the stored samples grow on top)."""
    k, c = setup.num_clients, setup.config.num_chains
    d = setup.model.param_dim(setup.num_features)
    bound_free = MH.resolve(setup.config.bounds, setup.model.has_bounded_potential()) == \
        "metropolis"
    # a preconditioner doubles the bounds held (the model's and those in z); without bounds
    # (metropolis) none are held, only the transform's d x d when there is one
    pre = PC.resolve(setup.config.preconditioner, d, setup.config.dp_epsilon > 0, bound_free)
    if bound_free:
        per = 0 if pre == "none" else 1
    else:
        per = 2 if pre == "none" else 4
    nbytes = (per * (k + 1) * d * d + 8 * c * d) * 8
    return MemoryEstimate(nbytes, f"{per} (K + 1) d^2 + 8 C d float64s, K = {k}, C = {c}, "
                                  f"d = {d}",
                          "use fewer features, or a family without d x d rate bounds "
                          "(pvi with pvi.covariance=diag, dsvgd, sgld)")


BUNDLE = Bundle(
    name="pdmc", config_class=PDMCConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, done=_done, failure_policy="retry-stop", corrupt=_corrupt,
    prior_diag=_prior_diag, memory_estimate=_memory_estimate)


def _preset(sampler: str):
    def preset(c):
        changes = {}
        if c.num_rounds == 10:  # the common default: no cap, the stopping rule ends the run
            changes["num_rounds"] = NO_CAP
        if c.eval_every == 1:  # recording every event would dominate the run
            changes["eval_every"] = DEFAULT_EVAL_EVERY
        if c.section.process_time == 0 and c.max_seconds == 0 and c.section.max_seconds > 0:
            changes["max_seconds"] = c.section.max_seconds  # the cap ends as "time-limit"
        return c.replace(**changes).with_section(sampler=sampler)
    return preset


PRESETS = {
    "pdmc": (_preset("zigzag"), "federated Zig-Zag sampler: every worker proposes its next "
                                "switching time, the server takes the earliest"),
    "pdmc-bps": (_preset("bps"), "federated bouncy particle sampler (refreshment at the server)"),
}


def registrations():
    """``(name, bundle, preset, description)`` for Fed-PDMC."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
