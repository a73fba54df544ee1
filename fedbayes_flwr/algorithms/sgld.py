"""Stochastic gradient Langevin dynamics (SGLD) and distributed SGLD (DSGLD), the Monte Carlo
baselines of the DSVGD paper, as one bundle.

Notation: ``theta_c`` is chain ``c`` of ``C`` (``sgld.num-chains``), ``t_c`` its own global step
counter (0 before its first step), ``p0`` the prior, ``n_k`` client ``k``'s rows, ``K`` the
number of clients, ``B`` the mini-batch (``sgld.batch-size``; 0 or ``B >= n_k`` = all rows).

**The update** (Welling & Teh 2011, eq. 4), for each chain at each step:

    theta <- theta + (eps_t / 2) (grad log p0(theta) + s sum_{i in batch} grad log p(x_i | theta))
             + N(0, eps_t I),     eps_t = a (b + t)^(-gamma),

with ``a = sgld.step-scale``, ``b = sgld.step-offset``, ``gamma = sgld.step-decay`` and ``s``
the likelihood rescaling below. ``gamma`` in ``(0.5, 1]`` meets the Robbins-Monro conditions
(Welling & Teh's default 0.55 is ours); ``gamma = 0`` is a constant step, i.e. the unadjusted
Langevin algorithm, whose stationary law is biased by ``O(eps)`` (on ``N(m, s^2)`` it is
``N(m, s^2 / (1 - eps / (4 s^2)))``; test). No Metropolis correction is made. All chains of a
step share one mini-batch (rows drawn without replacement from the client's seed), then one
standard-normal draw per coordinate. A model with a bounded ``support`` (``mixture-1d``) has its
chains clipped into it after every step, and a reply outside it is rejected.

**Initialisation.** ``C`` draws from the prior's Gaussian (the model's stand-in for a
non-Gaussian prior, clipped into a bounded support), as DSVGD's initial particles but from the
seed ``(run seed, "sgld.init")``; every counter ``t_c = 0``.

**SGLD** (``variant = "sgld"``, the ``sgld`` name: one client holding every row, as the
``svgd`` baseline): each round the server sends every chain and its counter to client 0, which
runs ``sgld.steps-per-round`` steps on every chain (``s = n / B``, the formula below with
``K = 1``) and returns them; the server
adopts them and advances the counters. ``num-rounds = 10`` with 200 steps per round makes the
paper's 2000 iterations, the same ``I x L`` budget as DSVGD.

**DSGLD** (``variant = "dsgld"``, Ahn, Shahbaba & Welling 2014): each round one chain moves,
chain ``(round - 1) mod C``, for ``sgld.steps-per-round`` steps (its trajectory) at one client
``k`` drawn uniformly at random from the server's seed ``(run seed, "sgld.schedule", round)``;
the server replaces that chain by the reply. The client rescales its mini-batch gradient by
``s = K n_k / B``, Ahn et al.'s ``N_k / (g_k B)`` for the visiting probability ``g_k = 1 / K``:
averaged over the client choice the gradient is the full-data gradient, for any partition
sizes, so the server needs neither ``n`` nor the ``n_k`` (it has no data and is not told the
sizes). With unequal partitions this estimator has a larger variance than Ahn et al.'s
size-proportional choice ``g_k = n_k / n`` (which would give ``s = n / B`` but needs the sizes
on the server); with equal partitions the two coincide. Within one trajectory the chain sees
only client ``k``'s data, so it drifts towards ``p0 l_k^K`` (Ahn et al.'s trajectory-length
trade-off): long ``steps-per-round`` with non-iid clients bias DSGLD, whichever ``g_k``.

**Rejected replies** leave the chains and their counters as they were; the round still counts
as an update (DSGLD then moves the next chain in the next round). Clients keep no state.

**Posterior.** :class:`fedbayes_flwr.inference.posterior.SamplePosterior` of the current chain states
``(C, d)``, like DSVGD's particles (no thinning, no averaging over iterations).

References
----------
Welling & Teh (2011), "Bayesian Learning via Stochastic Gradient Langevin Dynamics", eq. (4)
(the update and the step schedule ``a (b + t)^(-gamma)``).
Ahn, Shahbaba & Welling (2014), "Distributed Stochastic Gradient MCMC", Section 3 (DSGLD: chains
visiting workers, the ``N_k / (g_k B)`` rescaling, trajectory length).
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein
Variational Gradient Descent", Section 7 (the SGLD and DSGLD baselines and the ``I x L``
iteration budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import bounds
from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, MemoryEstimate, Rejection, Request, StepInfo
from fedbayes_flwr.algorithms.particles import (
    AUTO_PARTICLES,
    minibatch_grad,
    model_family,
    prior_draws,
    prior_score,
    project,
)
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.seeds import derive_seed, numpy_rng

VARIANTS = ("sgld", "dsgld")
TRAIN = "train"


@dataclass(frozen=True)
class SGLDConfig:
    """SGLD / DSGLD hyper-parameters: the run-config section ``[tool.flwr.app.config.sgld]``.

    Attributes
    ----------
    variant : str
        ``sgld`` (centralised, every chain every round) or ``dsgld`` (one chain per round at one
        random client); set by the algorithm names.
    num_chains : int
        ``C``; 0 = by model, as DSVGD's ``num-particles`` (200 for ``mixture-1d``, else 20).
    steps_per_round : int
        SGLD steps each moved chain makes per round (200: 10 rounds make the paper's 2000).
    step_scale, step_offset, step_decay : float
        ``a``, ``b``, ``gamma`` of the step ``eps_t = a (b + t)^(-gamma)``, ``t`` the chain's own
        step counter from 0; ``gamma = 0`` is a constant step ``a``.
    batch_size : int
        Mini-batch rows per step (0 = all rows); the likelihood gradient is rescaled by
        ``n_k / B`` (``K n_k / B`` for DSGLD, see the module docstring).
    """

    variant: str = "sgld"
    num_chains: int = 0
    steps_per_round: int = 200
    step_scale: float = 0.01
    step_offset: float = 0.5
    step_decay: float = 0.55
    batch_size: int = 100

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"sgld.{key}: {msg}")

        need(self.variant in VARIANTS, "variant",
             f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        need(self.num_chains >= 0, "num-chains",
             f"must be >= 0 (0 = by model), got {self.num_chains}")
        need(self.steps_per_round >= 1, "steps-per-round",
             f"must be >= 1, got {self.steps_per_round}")
        need(self.step_scale > 0, "step-scale", f"must be > 0, got {self.step_scale}")
        need(self.step_offset > 0, "step-offset", f"must be > 0, got {self.step_offset}")
        need(0 <= self.step_decay <= 1, "step-decay",
             f"must be in [0, 1] (0 = constant step), got {self.step_decay}")
        need(self.batch_size >= 0, "batch-size",
             f"must be >= 0 (0 = all rows), got {self.batch_size}")


# ---------------------------------------------------------------------------- states, messages
class ServerState(NamedTuple):
    """The chains ``(C, d)``, each chain's step counter ``(C,)`` and the updates made so far."""

    chains: np.ndarray
    steps: np.ndarray
    server_round: int


class ClientState(NamedTuple):
    """Nothing: SGLD clients are stateless (an empty array keeps the record format)."""

    empty: np.ndarray


class Down(NamedTuple):
    """Server -> client: the chains to move ``(M, d)`` (all of them for SGLD, one for DSGLD) and
    their step counters ``(M,)``."""

    chains: np.ndarray
    steps: np.ndarray
    server_round: int


class Up(NamedTuple):
    """Client -> server: the moved chains ``(M, d)``."""

    chains: np.ndarray
    request_round: int


# ---------------------------------------------------------------------------- settings
def num_chains(setup) -> int:
    """``C`` for this run (``num-chains`` or the model's default, as DSVGD's particles)."""
    n = setup.config.num_chains
    return int(n) if n else AUTO_PARTICLES[model_family(setup.model)]


def moved_chains(setup) -> int:
    """Chains one request carries: every chain (SGLD) or one (DSGLD)."""
    return 1 if setup.config.variant == "dsgld" else num_chains(setup)


def step_sizes(config: SGLDConfig, t: np.ndarray) -> np.ndarray:
    """``eps_t = a (b + t)^(-gamma)`` for step counters ``t``."""
    t = np.asarray(t, dtype=np.float64)
    return config.step_scale * (config.step_offset + t) ** (-config.step_decay)


def initial_chains(setup) -> np.ndarray:
    """``C`` draws from the prior's Gaussian (seed ``(run seed, "sgld.init")``), ``(C, d)``."""
    return prior_draws(setup, "sgld.init", num_chains(setup))


def scheduled(setup, number: int) -> tuple[int, int | None]:
    """``(chain, client)`` of round ``number`` (1-based): DSGLD's chain ``(number - 1) mod C`` at a
    uniformly drawn client; SGLD moves every chain (``chain`` -1) at client 0."""
    if setup.config.variant != "dsgld":
        return -1, 0
    rng = numpy_rng(derive_seed(setup.run_seed, "sgld.schedule", number, -1))
    return (number - 1) % num_chains(setup), int(rng.integers(setup.num_clients))


# ---------------------------------------------------------------------------- the maths
def likelihood_score(rng: np.random.Generator, x: np.ndarray, data, setup) -> np.ndarray:
    """``s sum_{i in batch} grad log p(x_i | theta)`` at each chain, ``s = K n_k / B`` (SGLD's one
    client: ``n / B``); one batch for every chain."""
    if data.x.shape[0] == 0:
        return np.zeros_like(x)
    return minibatch_grad(rng, x, data, setup, setup.config.batch_size, setup.num_clients)


def langevin(seed, chains: np.ndarray, steps: np.ndarray, data, setup) -> np.ndarray:
    """``sgld.steps-per-round`` SGLD steps (Welling & Teh eq. 4) of every chain from its own
    counter ``steps``; returns the moved chains."""
    rng = numpy_rng(seed)
    x = np.array(chains, dtype=np.float64)
    t = np.asarray(steps, dtype=np.float64)
    for j in range(setup.config.steps_per_round):
        eps = step_sizes(setup.config, t + j)[:, None]
        grad = prior_score(setup, x) + likelihood_score(rng, x, data, setup)
        x = project(x + 0.5 * eps * grad + np.sqrt(eps) * rng.standard_normal(x.shape), setup)
    return x


# ---------------------------------------------------------------------------- bundle functions
def _init_server(setup) -> ServerState:
    return ServerState(initial_chains(setup), np.zeros(num_chains(setup), np.int64), 0)


def _init_client(setup, partition_id: int) -> ClientState:
    return ClientState(np.zeros(0))


def _selection(setup, number: int) -> slice:
    chain, _ = scheduled(setup, number)
    return slice(None) if chain < 0 else slice(chain, chain + 1)


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    sel = _selection(setup, rnd.number)
    _, client = scheduled(setup, rnd.number)
    return {client: Request(TRAIN, Down(state.chains[sel], state.steps[sel], rnd.number))}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    message = request.message
    moved = langevin(seed, message.chains, message.steps, data, setup)
    return state, Up(moved, message.server_round), {}


def _server_step(state: ServerState, replies, setup, rnd):
    number = state.server_round + 1
    sel = _selection(setup, number)
    chains, steps = state.chains, state.steps
    accepted, rejected = [], []
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        chains, steps = chains.copy(), steps.copy()
        chains[sel] = reply.chains
        steps[sel] += setup.config.steps_per_round
        accepted.append(pid)
    diagnostics = ({"step_size": float(np.max(step_sizes(setup.config, steps[sel] - 1)))}
                   if accepted else {})
    return (ServerState(chains, steps, number),
            StepInfo(updates=1, accepted=tuple(accepted), rejected=tuple(rejected),
                     diagnostics=diagnostics))


def _posterior(state: ServerState, setup):
    return SamplePosterior(state.chains)


def _actions(setup) -> dict[str, ActionSpec]:
    m = moved_chains(setup)
    z = np.zeros((m, setup.prior.dim))
    return {TRAIN: ActionSpec("train", Down(z, np.zeros(m, np.int64), 0), Up(z, 0))}


def _client_state_template(setup) -> ClientState:
    return _init_client(setup, 0)


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """A reply answers this round's request, and its chains lie in a bounded prior's support and
    within ``2**26`` prior standard deviations of the prior mean
    (:func:`fedbayes_flwr.algorithms.bounds.position_error`)."""
    if reply.request_round != state.server_round + 1:
        return "request_round", (f"answers round {reply.request_round}, expected "
                                 f"{state.server_round + 1}")
    support = getattr(setup.model, "support", None)
    if support is not None and (np.any(reply.chains < support[0])
                                or np.any(reply.chains > support[1])):
        return "chains", f"outside the prior's support [{support[0]}, {support[1]}]"
    return bounds.position_error("chains", reply.chains, setup.prior)


def _corrupt(kind: str, reply, request: Request):
    """``wrong-shape``: one chain too few."""
    if kind == "wrong-shape":
        return reply._replace(chains=reply.chains[:-1])
    raise ValueError(f"SGLD cannot make a {kind!r} fault")


def _prior_diag(config: SGLDConfig, model) -> bool:
    return True


def _memory_estimate(setup) -> MemoryEstimate:
    """The chains SGLD holds: the server's and each request's ``(C, d)`` set, and the step's
    gradient and noise: ``(K + 4) C d`` float64s."""
    k, c = setup.num_clients, num_chains(setup)
    d = setup.model.param_dim(setup.num_features)
    return MemoryEstimate((k + 4) * c * d * 8, f"(K + 4) C d float64s, K = {k}, C = {c}, d = {d}",
                          "use fewer chains (sgld.num-chains)")


BUNDLE = Bundle(
    name="sgld", config_class=SGLDConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, corrupt=_corrupt, prior_diag=_prior_diag,
    memory_estimate=_memory_estimate)


# ---------------------------------------------------------------------------- presets
def _sgld(c):  # one client holding every row: the data never leave in a real federation
    return c.replace(num_clients=1).with_section(variant="sgld")


def _dsgld(c):
    return c.with_section(variant="dsgld")


PRESETS = {
    "sgld": (_sgld, "centralised SGLD on the pooled data, every chain the same I x L steps"),
    "dsgld": (_dsgld, "distributed SGLD: one chain per round walks at a random client"),
}


def registrations():
    """``(name, bundle, preset, description)`` for SGLD and DSGLD."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
