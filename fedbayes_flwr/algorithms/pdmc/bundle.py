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

**Output.** The trajectory is sampled every ``pdmc.discretisation`` units of process time; the
first ``pdmc.burn-in`` fraction of each chain's time is discarded at evaluation. The posterior is
a :class:`fedbayes_flwr.inference.posterior.SamplePosterior` with the chains kept apart (ESS and R-hat
across chains, ``tfp.mcmc``); the skeleton (event times, positions, velocities, up to
:data:`SKELETON_CAP` rows) is kept in the state and saved with the samples.

**Stopping.** With ``pdmc.process-time`` ``T > 0`` the run ends when every chain has reached
``T`` (samples beyond ``T`` dropped). Otherwise it ends at the first evaluation point where the
pooled minimum ESS over coordinates reaches ``pdmc.target-ess``, or after ``pdmc.max-seconds`` of
wall time (outcome ``completed`` either way; the diagnostics say which).

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
from fedbayes_flwr.algorithms.pdmc import privacy
from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import SamplePosterior, TracePosterior
from fedbayes_flwr.inference.potentials import Quadratic, cached, from_natural
from fedbayes_flwr.inference.sensitivity import clip_features
from fedbayes_flwr.models import make_model, model_spec
from fedbayes_flwr.seeds import derive_seed, numpy_rng

TRAIN = "train"
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
    max_seconds : float
        Wall-clock cap of an ESS-targeted run (0 = none): the run's ``max-seconds`` unless that
        is set, so a run that stops there says ``time-limit``, not ``done``.
    process_time : float
        ``T > 0``: run every chain to process time ``T`` instead.
    discretisation : float
        Spacing ``delta`` of the samples taken from the trajectory.
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
    """

    sampler: str = "zigzag"
    num_chains: int = 16
    target_ess: float = 400.0
    max_seconds: float = 110.0
    process_time: float = 0.0
    discretisation: float = 0.02
    burn_in: float = 0.1
    refresh_rate: float = 1.0
    max_horizon: float = 1.0
    flat_prior: bool = False
    dp_epsilon: float = 0.0
    dp_delta: float = 0.0
    dp_feature_clip: float = 1.0

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
        need(self.discretisation > 0, "discretisation",
             f"must be > 0, got {self.discretisation}")
        need(0 <= self.burn_in < 1, "burn-in", f"must be in [0, 1), got {self.burn_in}")
        need(self.refresh_rate >= 0, "refresh-rate", f"must be >= 0, got {self.refresh_rate}")
        need(self.max_horizon > 0, "max-horizon", f"must be > 0, got {self.max_horizon}")
        need(self.dp_epsilon >= 0, "dp-epsilon", f"must be >= 0 (0 = off), got {self.dp_epsilon}")
        need(0 <= self.dp_delta < 1, "dp-delta", f"must be in [0, 1), got {self.dp_delta}")
        need(self.dp_feature_clip > 0, "dp-feature-clip",
             f"must be > 0, got {self.dp_feature_clip}")
        if getattr(model_spec(run.model), "structured", False):
            return  # the generic check names the right family
        model = make_model(run.model, run.noise_scale)
        if not model.has_bounded_potential():
            raise ConfigError(f"model: PDMC needs rate bounds for the model's likelihood; "
                              f"{run.model!r} has none (gaussian-mean, logistic-regression, "
                              f"ar1-student-t do; a LikelihoodModel needs rate_bound=, its "
                              f"Hessian bounds)")
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


class ClientState(NamedTuple):
    """Workers keep nothing between events."""

    empty: np.ndarray


class Down(NamedTuple):
    x: np.ndarray
    v: np.ndarray
    horizon: np.ndarray
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


def worker_potential(model, data):
    """``U_m`` of a worker's rows, cached by the rows' content (built once per worker, not once
    per event)."""
    return cached(("pdmc", id(model)), data, lambda: model.bounded_potential(data.x, data.y))


def _dp_data(data, config: PDMCConfig):
    """With DP on, the rows clipped to the public feature bound (the sensitivity assumes it)."""
    if config.dp_epsilon <= 0:
        return data

    return data._replace(x=clip_features(data.x, config.dp_feature_clip))


def _own_proposal(state: ServerState, setup, rnd) -> S.Proposal:
    c = setup.config
    rng = numpy_rng(derive_seed(setup.run_seed, "pdmc.server", rnd.number, -1, rnd.step))
    return S.server_proposal(prior_potential(setup), c.sampler, state.x, state.v,
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
    return ServerState(x, v, np.zeros(k), np.zeros(k, np.int64),
                       np.zeros(setup.num_clients + 1, np.int64), 0, 0, np.zeros(k), chain, times,
                       points, chain.copy(), times.copy(), points.copy(), points.copy(),
                       time.time())


def _init_client(setup, partition_id: int) -> ClientState:
    return ClientState(np.zeros(0))


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    own = _own_proposal(state, setup, rnd)
    horizon = np.minimum(own.tau, setup.config.max_horizon)
    down = Down(state.x, state.v, horizon, rnd.number)
    return {pid: Request(TRAIN, down) for pid in range(setup.num_clients)}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    msg, config = request.message, setup.config
    rho = dp_rho(config, setup.model, setup.prior.dim)
    proposal = S.propose(worker_potential(setup.model, _dp_data(data, config)), config.sampler,
                         msg.x, msg.v, msg.horizon, numpy_rng(seed), rate_shift=rho)
    # with DP on, the number of rejected candidates (data-dependent) is not released
    evals = 0 if rho > 0 else int(proposal.grad_evals)
    return state, Up(proposal.tau, proposal.velocity, evals, msg.number), {}


def _server_step(state: ServerState, replies, setup, rnd):
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    if rejected:  # retry-stop: never reached with a missing worker (the engines stop first)
        raise RuntimeError(f"pdmc: {len(rejected)} worker replies missing; a worker cannot be "
                           f"dropped")
    c = setup.config
    own = _own_proposal(state, setup, rnd)
    good = sorted(replies, key=lambda item: item[0])
    workers = [S.Proposal(r.tau, r.velocity, r.grad_evals) for _, r in good]
    tau, velocity, winner = S.combine(own, workers, c.max_horizon)
    if c.process_time > 0:  # never move past T
        tau = np.minimum(tau, np.maximum(c.process_time - state.t, 0.0))
    rows, times, points, next_sample = S.discretise(state.x, state.v, state.t, tau,
                                                    state.next_sample, c.discretisation)
    x = state.x + state.v * tau[:, None]
    moved = tau > 0
    event = (winner >= 0) & moved
    v = np.where(event[:, None], velocity, state.v)
    t = state.t + tau
    winners = state.winners + np.bincount(winner[event], minlength=state.winners.size)
    skel = [state.skeleton_chain, state.skeleton_time, state.skeleton_x, state.skeleton_v]
    if state.skeleton_chain.size < SKELETON_CAP and np.any(event):
        hit = np.flatnonzero(event)
        skel = [np.concatenate([skel[0], hit]), np.concatenate([skel[1], t[hit]]),
                np.concatenate([skel[2], x[hit]]), np.concatenate([skel[3], v[hit]])]
    grad_evals = state.grad_evals + sum(int(r.grad_evals) for _, r in good) + own.grad_evals
    new = ServerState(x, v, t, state.events + event, winners, grad_evals, state.exchanges + 1,
                      next_sample, np.concatenate([state.sample_chain, rows]),
                      np.concatenate([state.sample_time, times]),
                      np.concatenate([state.samples, points]), *skel, state.started)
    info = StepInfo(updates=1, accepted=tuple(pid for pid, _ in good))
    if rnd.evaluate:
        info = info._replace(metrics=_metrics(new, setup), diagnostics=_diagnostics(new, setup))
    return new, info


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
        return np.repeat(state.x[:, None, :], 1, axis=1)
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
           "samples_per_chain": int(kept_chains(state, setup).shape[1])}
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

    return bool(np.min(SamplePosterior(chains).ess()) >= c.target_ess)


def _actions(setup) -> dict[str, ActionSpec]:
    k, d = setup.config.num_chains, setup.prior.dim
    z = np.zeros((k, d))
    return {TRAIN: ActionSpec("train", Down(z, z, np.zeros(k), 0), Up(np.zeros(k), z, 0, 0),
                              allow_inf=frozenset({"tau"}))}


def _client_state_template(setup) -> ClientState:
    return ClientState(np.zeros(0))


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """Event times ``> 0`` (``+inf`` allowed), velocities of the sampler's kind and of the speed
    sent (a reflection keeps it), this exchange."""
    if reply.number != state.exchanges + 1:
        return "number", f"answers exchange {reply.number}, expected {state.exchanges + 1}"
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
    ``d x d`` Hessian bound and its absolute value, ``2 (K + 1) d^2`` float64s, plus ``8 C d``
    for the chains' positions, velocities and proposals (the stored samples grow on top)."""
    k, c = setup.num_clients, setup.config.num_chains
    d = setup.model.param_dim(setup.num_features)
    nbytes = (2 * (k + 1) * d * d + 8 * c * d) * 8
    return MemoryEstimate(nbytes, f"2 (K + 1) d^2 + 8 C d float64s, K = {k}, C = {c}, d = {d}",
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
