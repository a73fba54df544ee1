"""FedAvg point estimates, the frequentist baselines of the DSVGD paper, as one bundle.

Notation: ``theta`` the global parameter vector, ``K`` clients, ``n_k`` client ``k``'s rows,
``n = sum_k n_k``, ``p0`` the prior.

**Start.** ``theta`` starts as one draw from the prior's Gaussian (:func:`initial_theta`).

**Local problem.** Client ``k`` starts from the received ``theta`` and takes
``fedavg.local-steps`` Adam steps (learning rate ``fedavg.learning-rate``, mini-batches of
``fedavg.batch-size`` rows, gradient rescaled by ``n_k / B``) uphill on

    log p(D_k | theta) + (1 / K) log p0(theta),

so the sum over clients is the log posterior: with identical local optima the fixed point is the
MAP estimate. The prior's share ``1 / K`` keeps the prior counted once whatever the partition.
Adam's moments restart at every local problem (as a fresh client optimiser does).

**Server updates.**

* ``fedavg`` (McMahan et al. 2017, Algorithm 1 with every client each round):
  ``theta <- sum_k n_k theta_k / sum_k n_k`` over the accepted replies (``n_k`` travels with the
  reply, as Flower's ``num-examples``).
* ``fedavg-paper`` (the DSVGD paper's FedAvg, Section 7.2: one client per round, round-robin):
  ``theta <- (n_k / n) theta_k + (1 - n_k / n) theta``. This is Flower's ``FedAvgM`` update with
  server learning rate ``n_k / n`` and no momentum: FedAvgM applies
  ``theta <- theta - eta (theta - theta_k)`` with ``eta = n_k / n`` (test). The server needs
  ``n``: the run opens with one ``query`` exchange in which every client reports ``n_k``
  (it counts as no update; if a count is rejected that round is spent without training and
  the missing counts are asked for again in the next).

Both are point estimates: the posterior interface holds the one vector (a
:class:`fedbayes_flwr.inference.posterior.SamplePosterior` of one sample), so metrics are those of the
plug-in predictive. Rejected replies leave ``theta`` unchanged.

References
----------
McMahan et al. (2017), "Communication-Efficient Learning of Deep Networks from Decentralized
Data", Algorithm 1 (FederatedAveraging). Hsu, Qi & Brown (2019), "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification" (FedAvgM: server
momentum and learning rate). Kassab & Simeone (2022), "Federated Generalized Bayesian Learning
via Distributed Stein Variational Gradient Descent", Section 7.2 (the FedAvg baseline, one agent
per round). Kingma & Ba (2015), "Adam", Algorithm 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import bounds
from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, MemoryEstimate, Rejection, Request, StepInfo
from fedbayes_flwr.algorithms.particles import minibatch_grad, prior_draws, prior_score
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.seeds import numpy_rng

VARIANTS = ("fedavg", "fedavg-paper")
TRAIN, SIZE = "train", "size"
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class FedAvgConfig:
    """FedAvg hyper-parameters: the run-config section ``[tool.flwr.app.config.fedavg]``.

    Attributes
    ----------
    variant : str
        ``fedavg`` (every client each round, size-weighted mean) or ``fedavg-paper`` (one
        client per round, ``theta <- (n_k / n) theta_k + (1 - n_k / n) theta``); set by the
        algorithm names.
    local_steps : int
        Adam steps per local problem.
    learning_rate : float
        Adam's step size.
    batch_size : int
        Rows per step (0 = all rows), the gradient rescaled by ``n_k / B``.
    """

    variant: str = "fedavg"
    local_steps: int = 100
    learning_rate: float = 0.01
    batch_size: int = 100

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"fedavg.{key}: {msg}")

        need(self.variant in VARIANTS, "variant",
             f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        need(self.local_steps >= 1, "local-steps", f"must be >= 1, got {self.local_steps}")
        need(self.learning_rate > 0, "learning-rate", f"must be > 0, got {self.learning_rate}")
        need(self.batch_size >= 0, "batch-size",
             f"must be >= 0 (0 = all rows), got {self.batch_size}")


class ServerState(NamedTuple):
    """The global vector, the round, and the clients' row counts (``-1`` until reported)."""

    theta: np.ndarray
    server_round: int
    sizes: np.ndarray


class ClientState(NamedTuple):
    """Clients keep nothing between rounds."""

    empty: np.ndarray


class Down(NamedTuple):
    theta: np.ndarray
    server_round: int


class Up(NamedTuple):
    """``theta_k`` and ``n_k`` (Flower's ``num-examples``)."""

    theta: np.ndarray
    num_examples: int
    request_round: int


class SizeQuery(NamedTuple):
    server_round: int


class SizeReply(NamedTuple):
    num_examples: int


# ---------------------------------------------------------------------------- the maths
def local_fit(seed, theta: np.ndarray, data, setup) -> np.ndarray:
    """Adam ascent on ``log p(D_k | theta) + log p0(theta) / K`` from ``theta``."""
    config = setup.config
    rng = numpy_rng(seed)
    x = theta.astype(np.float64).copy()
    m, v = np.zeros_like(x), np.zeros_like(x)
    b1, b2 = ADAM_BETAS
    for t in range(1, config.local_steps + 1):
        lik = minibatch_grad(rng, x[None], data, setup, config.batch_size)[0]
        grad = lik + prior_score(setup, x[None])[0] / setup.num_clients
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        step = config.learning_rate * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + ADAM_EPS)
        x = x + step
    return x


def weighted_mean(thetas: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    """FedAvg's aggregate ``sum_k n_k theta_k / sum_k n_k``."""
    w = np.asarray(sizes, dtype=np.float64)
    return np.tensordot(w / w.sum(), np.stack(thetas), axes=1)


def fedavgm_step(theta: np.ndarray, theta_k: np.ndarray, server_learning_rate: float) -> np.ndarray:
    """FedAvgM without momentum: ``theta - eta (theta - theta_k)``; with ``eta = n_k / n`` the
    DSVGD paper's ``(n_k / n) theta_k + (1 - n_k / n) theta``."""
    return theta - server_learning_rate * (theta - theta_k)


def scheduled(setup, number: int) -> list[int]:
    if setup.config.variant == "fedavg":
        return list(range(setup.num_clients))
    return [(number - 1) % setup.num_clients]


# ---------------------------------------------------------------------------- bundle functions
def initial_theta(setup) -> np.ndarray:
    """One draw from the prior's Gaussian (seed ``(run seed, "fedavg.init")``): the prior mean
    (zero) would leave a ReLU network's hidden units identical and their gradients zero."""
    return prior_draws(setup, "fedavg.init", 1)[0]


def _init_server(setup) -> ServerState:
    return ServerState(initial_theta(setup), 0, np.full(setup.num_clients, -1, np.int64))


def _init_client(setup, partition_id: int) -> ClientState:
    return ClientState(np.zeros(0))


def _needs_sizes(state: ServerState, setup) -> bool:
    return setup.config.variant == "fedavg-paper" and bool(np.any(state.sizes < 0))


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    if _needs_sizes(state, setup):
        return {pid: Request(SIZE, SizeQuery(state.server_round)) for pid in range(setup.num_clients)}
    number = state.server_round + 1
    return {pid: Request(TRAIN, Down(state.theta, number)) for pid in scheduled(setup, number)}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    n = int(data.x.shape[0])
    if request.action == SIZE:
        return state, SizeReply(n), {}
    message = request.message
    return state, Up(local_fit(seed, message.theta, data, setup), n, message.server_round), {}


def _server_step(state: ServerState, replies, setup, rnd):
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    good = sorted(((pid, r) for pid, r in replies if not isinstance(r, Rejection)),
                  key=lambda item: item[0])
    if _needs_sizes(state, setup):
        sizes = state.sizes.copy()
        for pid, reply in good:
            sizes[pid] = reply.num_examples
        # all counts in: no update, the engines go on to this round's training exchange; a
        # count missing: the round is spent (an update with nothing accepted), so a client that
        # never answers cannot hold the run in a loop
        missing = bool(np.any(sizes < 0))
        return (state._replace(sizes=sizes, server_round=state.server_round + missing),
                StepInfo(updates=int(missing), rejected=rejected))
    theta = state.theta
    if good and setup.config.variant == "fedavg":
        theta = weighted_mean([r.theta for _, r in good], [r.num_examples for _, r in good])
    elif good:
        pid, reply = good[0]
        theta = fedavgm_step(theta, reply.theta, reply.num_examples / float(state.sizes.sum()))
    return (ServerState(theta, state.server_round + 1, state.sizes),
            StepInfo(updates=1, accepted=tuple(pid for pid, _ in good), rejected=rejected))


def _posterior(state: ServerState, setup):
    return SamplePosterior(state.theta[None])


def _actions(setup) -> dict[str, ActionSpec]:
    z = np.zeros(setup.prior.dim)
    return {TRAIN: ActionSpec("train", Down(z, 0), Up(z, 0, 0)),
            SIZE: ActionSpec("query", SizeQuery(0), SizeReply(0))}


def _client_state_template(setup) -> ClientState:
    return ClientState(np.zeros(0))


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """A positive row count; a train reply answers this round's request, with ``theta`` within
    ``2**26`` prior standard deviations of the prior mean
    (:func:`fedbayes_flwr.algorithms.bounds.position_error`)."""
    if reply.num_examples < 1:
        return "num_examples", f"must be >= 1, got {reply.num_examples}"
    if action == TRAIN and reply.request_round != state.server_round + 1:
        return "request_round", (f"answers round {reply.request_round}, expected "
                                 f"{state.server_round + 1}")
    if action == TRAIN:
        return bounds.position_error("theta", reply.theta, setup.prior)
    return None


def _corrupt(kind: str, reply, request: Request):
    """``wrong-shape``: one parameter too few."""
    if kind == "wrong-shape" and request.action == TRAIN:
        return reply._replace(theta=reply.theta[:-1])
    raise ValueError(f"FedAvg cannot make a {kind!r} fault")


def _prior_diag(config: FedAvgConfig, model) -> bool:
    return True


def _memory_estimate(setup) -> MemoryEstimate:
    """One parameter vector per client plus the server's and Adam's two moments:
    ``(K + 4) d`` float64s."""
    k, d = setup.num_clients, setup.model.param_dim(setup.num_features)
    return MemoryEstimate((k + 4) * d * 8, f"(K + 4) d float64s, K = {k}, d = {d}",
                          "use fewer features")


BUNDLE = Bundle(
    name="fedavg", config_class=FedAvgConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, corrupt=_corrupt, prior_diag=_prior_diag,
    memory_estimate=_memory_estimate)


def _paper(c):
    return c.with_section(variant="fedavg-paper")


def _modern(c):
    return c.with_section(variant="fedavg")


PRESETS = {
    "fedavg": (_modern, "FedAvg point estimate: every client each round, size-weighted mean"),
    "fedavg-paper": (_paper, "the DSVGD paper's FedAvg: one client per round, "
                             "theta <- (n_k/n) theta_k + (1 - n_k/n) theta (FedAvgM, no momentum)"),
}


def registrations():
    """``(name, bundle, preset, description)`` for the two FedAvg baselines."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
