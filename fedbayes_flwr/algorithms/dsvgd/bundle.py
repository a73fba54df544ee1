"""Distributed Stein variational gradient descent (DSVGD), its unconstrained and parallel forms,
and centralised SVGD, as one bundle.

Notation: ``theta^(i)`` are the ``N`` global particles after round ``i`` (``q^(i)`` their KDE),
``t_k^(i)`` client ``k``'s approximate likelihood factor, ``L_k`` the summed negative
log-likelihood of its rows, ``alpha`` the temperature (``dsvgd.temperature``, dividing the loss
only), ``p0`` the prior.

**Initialisation.** ``theta^(0)`` are ``N`` draws from the prior's Gaussian (the model's stand-in
for a non-Gaussian prior, clipped into a bounded support), from the seed ``(run seed,
"dsvgd.init")``, computed identically by the server and every client. Every factor starts as
``t_k^(0) = KDE(theta^(0))``, about ``p0``.

**Local update** (client ``k`` scheduled at round ``i``, paper eqs. 4-7): starting from
``theta^(i-1)``, ``dsvgd.local-iterations`` SVGD steps towards

    p~(theta) ∝ q^(i-1)(theta) / t_k^(i-1)(theta) * p0(theta) * exp(-L_k(theta) / alpha).

**Where the prior enters.** Each factor carries one ``p0`` (its ``t_k^(0)``), and each local
target multiplies ``p0`` back in. With ``q = p0 prod_j l_j`` and ``t_k = p0 l_k``, the cavity is
``prod_{j != k} l_j`` and the target ``p0 prod_j l_j``: the prior counts exactly once in the global
target, as in the reference code (which adds the prior's gradient in every client's update).
In the first round the cavity scores cancel exactly (``q^(0) = t_k^(0)``), so one client and one
round is centralised SVGD (test).

**Factors.** DSVGD (``variant = "dsvgd"``): client ``k`` keeps ``N`` local particles whose KDE is
``t_k``; after the local update it runs ``dsvgd.distillation-iterations`` SVGD steps from its old
local particles towards ``t_k^(i) ∝ q^(i)_k t_k^(i-1) / q^(i-1)`` (``q^(i)_k`` the KDE of its new
global particles), so its memory stays ``N d``. U-DSVGD (``variant = "u-dsvgd"``): the factor is
kept exactly as the unrolled product ``t_k^(i) = KDE(theta^(0)) prod_j KDE(theta_k^(j)) /
KDE(theta^(j-1))`` over its visits ``j``, so it grows by ``2 N d`` numbers per visit. The two
produce the same global particles over the first pass (every factor is still ``t_k^(0)``).

**Several clients per round** (P-DSVGD, ``clients-per-round > 1``): each scheduled client ``k``
runs its local update from ``theta^(i-1)`` and uploads its new global particles ``theta_k^(i)``
(``N x d``, as in DSVGD); by its distillation target ``t_k^(i) / t_k^(i-1) = q_k^(i) / q^(i-1)``.
The server then runs a data-free SVGD loop (``dsvgd.local-iterations`` steps) from
``theta^(i-1)`` towards

    q^(i)(theta) ∝ q^(i-1)(theta) prod_{k in S_i} t_k^(i)(theta) / t_k^(i-1)(theta)
                 = KDE(theta^(i-1))^(1 - |S_i|) prod_{k in S_i} KDE(theta_k^(i)).

With one accepted client the product is ``KDE(theta_k^(i))`` and the server takes
``theta_k^(i)`` itself, which is DSVGD exactly (test). A rejected client drops out of ``S_i``.

**Centralised SVGD** (``variant = "svgd"``, the ``svgd`` baseline, one client holding every row):
each round runs ``dsvgd.local-iterations`` SVGD steps towards ``p0 exp(-L / alpha)`` from the
current particles, so ``I`` rounds make the same ``I x L`` iterations as DSVGD (AdaGrad's
accumulator restarts every round, as it does in every DSVGD loop).

**KDEs and floors.** Isotropic Gaussian kernels with standard deviation
``dsvgd.kde-bandwidth``: ``auto`` (Scott's rule on the set's own spread,
:func:`fedbayes_flwr.algorithms.dsvgd.svgd.kde_bandwidth`, computed per particle set, with the centres
shrunk so
the KDE keeps the particles' variance, :func:`fedbayes_flwr.algorithms.dsvgd.svgd.shrink_kde`), ``scott``
(without the
shrinkage) or an absolute float (``0.55`` reproduces the paper). Log densities use log-sum-exp;
each kernel term is floored at ``dsvgd.kde-floor`` (default ``1e-9`` of its peak, as the
reference) in log space, so a floored term is a constant with zero gradient. Without the floor
the scores of KDE ratios diverge on second visits (gaussian-mean, d = 2, 10 clients, Dirichlet
0.5, N = 20: 4-40 posterior sd off after 3 passes).

**Bounded priors.** A model with a ``support`` (``mixture-1d``: uniform on ``[-6, 6]``) has its
particles projected back into the support (clipped) after every SVGD step, on clients and
server alike; a reply with particles outside the support is rejected.

**Step sizes and mini-batches.** SVGD with the RBF kernel and median heuristic, AdaGrad with
momentum restarted at each loop (:mod:`fedbayes_flwr.algorithms.dsvgd.svgd`); ``dsvgd.batch-size`` rows per
iteration (0 = all), the likelihood gradient rescaled by ``n_k / B``, rows drawn from the
client's seed.

References
----------
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein
Variational Gradient Descent", eqs. (4)-(7) (local free energy and its targets), Algorithm 1
(DSVGD), Algorithm 2 (U-DSVGD), Section 6 (parallel DSVGD) and Section 7 (settings).
Liu & Wang (2016), "Stein Variational Gradient Descent", eq. (8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import bounds, commit
from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, MemoryEstimate, Rejection, Request, StepInfo
from fedbayes_flwr.algorithms.dsvgd.svgd import svgd
from fedbayes_flwr.algorithms.particles import (
    AUTO_PARTICLES,
    minibatch_grad,
    model_family,
    prior_draws,
    prior_score,
    project,
)
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference.kde import KDE, kde_score, log_ratio_score, ratio_kdes
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.seeds import derive_seed, numpy_rng

VARIANTS = ("dsvgd", "u-dsvgd", "svgd")
SCHEDULES = ("round-robin", "random")
TRAIN = "train"

#: (learning rate, AdaGrad eps) of the reference code: BNNs, everything else.
AUTO_STEP = {"bnn": (1e-3, 1e-6), "other": (0.05, 1e-9)}
#: ``learning-rate = auto`` for non-BNN models: this fraction of the starting particles' spread.
AUTO_RELATIVE_STEP = 0.1
DISTILLATION_STARTS = ("global", "local")


@dataclass(frozen=True)
class DSVGDConfig:
    """DSVGD hyper-parameters: the run-config section ``[tool.flwr.app.config.dsvgd]``.

    Attributes
    ----------
    variant : str
        ``dsvgd`` (distilled local particles), ``u-dsvgd`` (the unrolled factor) or ``svgd``
        (centralised); set by the algorithm names.
    num_particles : int
        ``N``; 0 = by model: 200 for ``mixture-1d``, 20 otherwise (BNNs as the reference; linear
        models 20 where the reference uses 6, because 6 particles under-disperse: std 0.3-0.4 of
        the posterior's on ``gaussian-mean``, the table in docs/families/dsvgd.md).
    local_iterations, distillation_iterations : int
        ``L`` SVGD steps of the local and the distillation loop (200).
    clients_per_round : int
        Clients scheduled each round (1: DSVGD; more: P-DSVGD).
    schedule : str
        ``round-robin`` or ``random`` (seeded, without replacement within a round).
    learning_rate, adagrad_eps : float
        AdaGrad-with-momentum base rate and fudge factor; 0 = auto: BNNs the reference's
        1e-3 and 1e-6; other models a rate of 0.1 times the loop's starting spread (see
        :func:`step_settings`; ``0.05`` reproduces the reference's logistic runs) and 1e-9.
    batch_size : int
        Mini-batch rows per SVGD iteration (0 = all rows).
    kde_bandwidth : str
        ``auto`` (Scott's rule with variance-preserving centres,
        :func:`fedbayes_flwr.algorithms.dsvgd.svgd.shrink_kde`),
        ``scott`` (Scott's rule alone) or an absolute standard deviation (``0.55``: the paper).
    kde_floor : float
        Floor of each KDE kernel term relative to its peak, in ``[0, 1)`` (0 = none).
    temperature : float
        ``alpha`` dividing the loss (1: Bayesian posterior).
    distillation_start : str
        Where the distillation loop starts: ``global`` (the client's new global particles,
        where the KDE ratio ``q_k^(i) / q^(i-1)`` is accurate) or ``local`` (its old local
        particles, the reference code). From ``local`` the floored ratio is flat wherever the
        old local particles lie far from both clouds, so they barely move, ``t_k`` misses the
        client's likelihood and the next visit counts it twice (stds shrink pass after pass:
        0.74, 0.46, 0.34 of the posterior's on ``gaussian-mean``; 0.74, 0.76, 0.84 from
        ``global``).
    """

    variant: str = "dsvgd"
    num_particles: int = 0
    local_iterations: int = 200
    distillation_iterations: int = 200
    clients_per_round: int = 1
    schedule: str = "round-robin"
    learning_rate: float = 0.0
    adagrad_eps: float = 0.0
    batch_size: int = 100
    kde_bandwidth: str = "auto"
    kde_floor: float = 1e-9
    temperature: float = 1.0
    distillation_start: str = "global"

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"dsvgd.{key}: {msg}")

        need(self.variant in VARIANTS, "variant",
             f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        need(self.distillation_start in DISTILLATION_STARTS, "distillation-start",
             f"unknown start {self.distillation_start!r}; choose one of "
             f"{', '.join(DISTILLATION_STARTS)}")
        need(self.schedule in SCHEDULES, "schedule",
             f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        need(self.num_particles >= 0, "num-particles",
             f"must be >= 0 (0 = by model), got {self.num_particles}")
        need(self.num_particles != 1, "num-particles",
             "must be >= 2 (one particle has no KDE spread and no repulsion)")
        for key, value in (("local-iterations", self.local_iterations),
                           ("distillation-iterations", self.distillation_iterations)):
            need(value >= 1, key, f"must be >= 1, got {value}")
        need(1 <= self.clients_per_round <= run.num_clients, "clients-per-round",
             f"must be in 1..num-clients ({run.num_clients}), got {self.clients_per_round}")
        need(self.learning_rate >= 0, "learning-rate",
             f"must be > 0 (0 = by model), got {self.learning_rate}")
        need(self.adagrad_eps >= 0, "adagrad-eps",
             f"must be > 0 (0 = by model), got {self.adagrad_eps}")
        need(self.batch_size >= 0, "batch-size",
             f"must be >= 0 (0 = all rows), got {self.batch_size}")
        need(0 <= self.kde_floor < 1, "kde-floor", f"must be in [0, 1), got {self.kde_floor}")
        need(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        try:
            bandwidth_rule(self)
        except ValueError:
            need(False, "kde-bandwidth",
                 f"expected 'auto', 'scott' or a positive number, got {self.kde_bandwidth!r}")


# ---------------------------------------------------------------------------- states, messages
class ServerState(NamedTuple):
    """Global particles ``theta^(i)`` ``(N, d)``, the round, and per client the last request round
    whose reply was applied (sent back so clients commit their factor)."""

    particles: np.ndarray
    server_round: int
    accepted_round: np.ndarray


class Factor(NamedTuple):
    """Client ``k``'s factor ``t_k``.

    DSVGD: ``numerators`` is ``(1, N, d)``, its local particles; ``denominators`` is empty.
    U-DSVGD: ``t_k = prod_v KDE(numerators[v]) / prod_v KDE(denominators[v])``, ``(V + 1, N, d)``
    and ``(V, N, d)`` after ``V`` visits (``numerators[0] = theta^(0)``).
    """

    numerators: np.ndarray
    denominators: np.ndarray


class Down(NamedTuple):
    """Server -> client: the global particles and the acknowledgement of the client's last reply."""

    particles: np.ndarray
    server_round: int
    accepted_round: int


class Up(NamedTuple):
    """Client -> server: the client's new global particles ``theta_k^(i)``."""

    particles: np.ndarray
    request_round: int


def num_particles(setup) -> int:
    """``N`` for this run (``num-particles`` or the model's default)."""
    n = setup.config.num_particles
    return int(n) if n else AUTO_PARTICLES[model_family(setup.model)]


def step_settings(setup, start: np.ndarray) -> tuple[float, float]:
    """(learning rate, AdaGrad eps) of an SVGD loop starting at ``start``.

    ``learning-rate = 0`` (auto): BNNs take the reference's ``1e-3``; other models
    ``AUTO_RELATIVE_STEP`` times the starting particles' spread (mean per-coordinate sd). The
    AdaGrad-with-momentum step is about ``eta`` per coordinate whatever the gradient's size, so
    the particles keep moving by about ``eta`` at the fixed point: an absolute ``eta = 0.05``
    (the reference) leaves centralised SVGD 0.1-1.1 posterior sd off on ``gaussian-mean`` with
    200 rows (posterior sd 0.07), whatever the number of iterations.
    """
    family = "bnn" if model_family(setup.model) == "bnn" else "other"
    lr, eps = AUTO_STEP[family]
    if not setup.config.learning_rate and family != "bnn" and start.shape[0] > 1:
        spread = float(np.mean(np.std(start, axis=0, ddof=1)))
        if spread > 0:
            lr = AUTO_RELATIVE_STEP * spread
    return (setup.config.learning_rate or lr), (setup.config.adagrad_eps or eps)


def bandwidth_rule(config: DSVGDConfig) -> str | float:
    """``"auto"`` or the absolute bandwidth as a float (raises ValueError for anything else)."""
    text = str(config.kde_bandwidth).strip()
    if text in ("auto", "scott"):
        return text
    value = float(text)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


def initial_particles(setup) -> np.ndarray:
    """``theta^(0)``: ``N`` draws from the prior's Gaussian, the same on server and clients."""
    return prior_draws(setup, "dsvgd.init", num_particles(setup))


# ---------------------------------------------------------------------------- scores
def likelihood_score(rng: np.random.Generator, x: np.ndarray, data, setup) -> np.ndarray:
    """``grad (-L_k / alpha)`` at each particle, from a mini-batch rescaled by ``n_k / B``."""
    return minibatch_grad(rng, x, data, setup, setup.config.batch_size) / setup.config.temperature


def _ratio(numerators, denominators, setup,
           pair_all: bool = False) -> tuple[list[KDE], list[KDE]]:
    """The KDEs of ``prod KDE(numerators) / prod KDE(denominators)`` under
    ``dsvgd.kde-bandwidth`` (:func:`fedbayes_flwr.algorithms.dsvgd.svgd.ratio_kdes`; ``auto`` pairs and
    shrinks).
    The callers order the sets so partners are the two particle sets of one visit (the received
    and the returned global particles) or the cavity's ``q`` and ``t_k^(0)``."""
    rule = bandwidth_rule(setup.config)
    if rule == "auto":
        return ratio_kdes(numerators, denominators, "auto", paired=True, pair_all=pair_all)
    return ratio_kdes(numerators, denominators, "auto" if rule == "scott" else rule,
                      paired=False)


def _score(x, kdes_num, kdes_den, floor: float) -> np.ndarray:
    return log_ratio_score(x, kdes_num, kdes_den, floor)


def _loop(start: np.ndarray, score_fn, iterations: int, setup) -> np.ndarray:
    """One SVGD loop with the support projection after every step."""
    lr, eps = step_settings(setup, start)
    if getattr(setup.model, "support", None) is None:
        return svgd(start, score_fn, iterations, lr, eps)
    x = start
    for _ in range(iterations):  # one step per call: project between steps
        x = project(svgd(x, score_fn, 1, lr, eps), setup)
    return x


# ---------------------------------------------------------------------------- the maths
def local_update(seed, factor: Factor, particles: np.ndarray, data, setup) -> np.ndarray:
    """The local SVGD loop: ``theta^(i-1) -> theta_k^(i)`` towards the tilted cavity (eq. 5).

    Target score ``grad log q^(i-1) - grad log t_k^(i-1) + grad log p0 - grad L_k / alpha``; the
    ``svgd`` variant drops the two KDE terms.
    """
    config = setup.config
    rng = numpy_rng(seed)
    floor = config.kde_floor
    if config.variant == "svgd":
        num, den = [], []
    else:
        num, den = _ratio([particles, *factor.denominators], list(factor.numerators), setup)

    def target(x):
        return (_score(x, num, den, floor) + prior_score(setup, x)
                + likelihood_score(rng, x, data, setup))

    return _loop(particles, target, config.local_iterations, setup)


def distil(factor: Factor, old_global: np.ndarray, new_global: np.ndarray, setup) -> Factor:
    """The new factor ``t_k^(i) ∝ q_k^(i) t_k^(i-1) / q^(i-1)`` (eq. 7).

    DSVGD: the distillation SVGD loop moves the local particles towards it. U-DSVGD: the ratio
    is kept exactly (two more particle sets).
    """
    config = setup.config
    if config.variant == "u-dsvgd":
        return Factor(np.concatenate([factor.numerators, new_global[None]]),
                      np.concatenate([factor.denominators, old_global[None]]))
    if config.variant == "svgd":
        return factor
    num, den = _ratio([new_global, *factor.numerators], [old_global, *factor.denominators], setup)
    start = new_global if config.distillation_start == "global" else factor.numerators[0]
    local = _loop(start, lambda x: _score(x, num, den, config.kde_floor),
                  config.distillation_iterations, setup)
    return Factor(local[None], factor.denominators)


def server_merge(old: np.ndarray, uploads: list[np.ndarray], setup) -> np.ndarray:
    """P-DSVGD's data-free server loop towards ``KDE(old)^(1 - S) prod_k KDE(theta_k)``; with one
    upload, that upload itself (DSVGD)."""
    if len(uploads) == 1:
        return uploads[0]
    num, (old_kde,) = _ratio(uploads, [old], setup, pair_all=True)
    weight = len(uploads) - 1
    floor = setup.config.kde_floor

    def target(x):
        return _score(x, num, [], floor) - weight * kde_score(x, old_kde.centres,
                                                              old_kde.bandwidth, floor)

    return _loop(old, target, setup.config.local_iterations, setup)


def schedule(setup, number: int) -> list[int]:
    """Clients scheduled in round ``number`` (1-based)."""
    k, c = setup.num_clients, setup.config.clients_per_round
    if setup.config.schedule == "random":
        rng = numpy_rng(derive_seed(setup.run_seed, "dsvgd.schedule", number, -1))
        return sorted(int(p) for p in rng.choice(k, size=c, replace=False))
    return sorted({(c * (number - 1) + j) % k for j in range(c)})


# ---------------------------------------------------------------------------- bundle functions
def _empty(setup) -> np.ndarray:
    return np.zeros((0, num_particles(setup), setup.prior.dim))


def _init_server(setup) -> ServerState:
    return ServerState(initial_particles(setup), 0,
                       np.full(setup.num_clients, commit.NO_ROUND, np.int64))


def _init_client(setup, partition_id: int) -> commit.Pending:
    return commit.init(Factor(initial_particles(setup)[None], _empty(setup)))


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    return {pid: Request(TRAIN, Down(state.particles, rnd.number, int(state.accepted_round[pid])))
            for pid in schedule(setup, rnd.number)}


def _client_step(seed, state: commit.Pending, request: Request, data, setup):
    message = request.message
    state = commit.acknowledge(state, message.accepted_round)
    new = local_update(seed, state.value, message.particles, data, setup)
    factor = distil(state.value, message.particles, new, setup)
    return (commit.propose(state, factor, message.server_round),
            Up(new, message.server_round), {})


def _server_step(state: ServerState, replies, setup, rnd):
    accepted, rejected, uploads = [], [], []
    acc = state.accepted_round
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        uploads.append(reply.particles)
        accepted.append(pid)
        acc = commit.record_accepted(acc, pid, reply.request_round)
    particles = server_merge(state.particles, uploads, setup) if uploads else state.particles
    return (ServerState(particles, state.server_round + 1, acc),
            StepInfo(updates=1, accepted=tuple(accepted), rejected=tuple(rejected)))


def _posterior(state: ServerState, setup):
    return SamplePosterior(state.particles)


def _actions(setup) -> dict[str, ActionSpec]:
    z = np.zeros((num_particles(setup), setup.prior.dim))
    return {TRAIN: ActionSpec("train", Down(z, 0, 0), Up(z, 0))}


def _client_state_template(setup) -> commit.Pending:
    """Template of the stored client state; U-DSVGD's factor grows by one set per visit (the
    stored state is loaded by rank, not shape)."""
    z = np.zeros((1, num_particles(setup), setup.prior.dim))
    return commit.init(Factor(z, _empty(setup)))


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """Particles must lie in a bounded prior's support and within ``2**26`` prior standard
    deviations of the prior mean (:func:`fedbayes_flwr.algorithms.bounds.position_error`)."""
    support = getattr(setup.model, "support", None)
    if support is not None and (np.any(reply.particles < support[0])
                                or np.any(reply.particles > support[1])):
        return "particles", f"outside the prior's support [{support[0]}, {support[1]}]"
    return bounds.position_error("particles", reply.particles, setup.prior)


def _corrupt(kind: str, reply, request: Request):
    """``wrong-shape``: one particle too few."""
    if kind == "wrong-shape":
        return reply._replace(particles=reply.particles[:-1])
    raise ValueError(f"DSVGD cannot make a {kind!r} fault")


def _prior_diag(config: DSVGDConfig, model) -> bool:
    return True


def _memory_estimate(setup) -> MemoryEstimate:
    """The particle sets DSVGD holds: the global set, each client's local set and its factor's
    KDE particles, and the SVGD loop's working sets (scores, direction, AdaGrad state, the
    distillation target): ``(2 K + 6) N d`` float64s, plus ``4 N^2`` for the kernel matrices
    (the SVGD kernel and the KDE ratios). U-DSVGD's factors grow by two sets per visit on top."""
    k, n = setup.num_clients, num_particles(setup)
    d = setup.model.param_dim(setup.num_features)
    nbytes = ((2 * k + 6) * n * d + 4 * n * n) * 8
    return MemoryEstimate(nbytes, f"(2 K + 6) N d + 4 N^2 float64s, K = {k}, N = {n}, d = {d}",
                          "use fewer particles (dsvgd.num-particles) or fewer clients")


BUNDLE = Bundle(
    name="dsvgd", config_class=DSVGDConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, corrupt=_corrupt, prior_diag=_prior_diag,
    memory_estimate=_memory_estimate)


# ---------------------------------------------------------------------------- presets
def _u_dsvgd(c):
    return c.with_section(variant="u-dsvgd")


def _p_dsvgd(c):
    return c.with_section(variant="dsvgd", clients_per_round=c.num_clients)


def _svgd(c):  # one client holding every row: the data never leave in a real federation
    return c.replace(num_clients=1).with_section(variant="svgd", clients_per_round=1)


PRESETS = {
    "dsvgd": (None, "DSVGD: particles go down and up; clients keep N distilled local particles"),
    "u-dsvgd": (_u_dsvgd, "U-DSVGD: the unrolled KDE-ratio factor (client memory grows)"),
    "p-dsvgd": (_p_dsvgd, "parallel DSVGD: every client each round, a data-free server merge"),
    "svgd": (_svgd, "centralised SVGD on the pooled data, the same I x L iterations"),
}


def registrations():
    """``(name, bundle, preset, description)`` for DSVGD and its SVGD baselines."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
