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

**Beyond the paper (the defaults; issue 26).** The paragraphs above describe the paper's
settings, kept as the ``*-paper`` presets (``dsvgd.kernel = "isotropic"``, the paper's bandwidth
and fixed AdaGrad step). With ``auto`` and ``d >= 3`` the defaults differ:

- ``dsvgd.kernel = "mahalanobis"``: SVGD runs in coordinates whitened by the particles' covariance
  (Wang et al. 2019), and the KDE factors use kernels shaped by each particle set's own
  covariance (:func:`fedbayes_flwr.inference.kde.matrix_kde`). The server's merge no longer
  floors the clients' terms, which is what made P-DSVGD's particles explode on non-overlapping
  (label-skewed) clients.
- ``dsvgd.svgd-bandwidth``: ``h = med^2`` instead of the paper's ``med^2 / log N``. That rule
  collapses the spread in more than a few dimensions (Ba et al. 2021).
- ``dsvgd.step = "scaled"``: a step relative to the particles' current spread, decaying as
  ``(1 + t / 20)^(-1/2)``, on full batches.
- ``N = clip(ceil(particles-per-dim x d), 20, 200)``.
- The divergence guard (``dsvgd.guard``): a loop that turns non-finite, spreads tenfold or
  moves by 1e3 spreads is rolled back and rerun with a 10 times smaller step, and the history
  row records it.
- Every row records the particles' kernel Stein discrepancy (``diagnostics.ksd``).

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
Liu & Wang (2016), "Stein Variational Gradient Descent", eq. (8); Wang, Tang, Bajaj & Liu
(2019), "Stein Variational Gradient Descent with Matrix-Valued Kernels", NeurIPS (the whitened
kernel); Ba et al. (2021), "Understanding the Variance Collapse of SVGD in High Dimensions",
ICLR (the bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import bounds, commit
from fedbayes_flwr.algorithms.base import (
    ActionSpec,
    Bundle,
    MemoryEstimate,
    Rejection,
    Request,
    StepInfo,
)
from fedbayes_flwr.algorithms.dsvgd.svgd import (
    MEDIAN_BANDWIDTH_SCALE,
    SCALED_STEP,
    LoopReport,
    Whitening,
    guarded_svgd,
    scaled_svgd,
    svgd,
    whitening,
)
from fedbayes_flwr.algorithms.particles import (
    AUTO_PARTICLES,
    minibatch_grad,
    model_family,
    prior_draws,
    prior_score,
    project,
)
from fedbayes_flwr.errors import ConfigError, RunStopped
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.kde import (
    KDE,
    kde_score,
    log_ratio_score,
    matrix_kde_score,
    matrix_ratio_kdes,
    ratio_kdes,
    smooth_kde,
)
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
#: ``mahalanobis``: SVGD and KDE kernels with the particles' covariance as metric (whitened
#: coordinates); ``isotropic``: Euclidean kernels (the paper).
KERNELS = ("auto", "mahalanobis", "isotropic")
#: ``scaled``: a rate following the particles' spread and decaying (:func:`scaled_svgd`);
#: ``fixed``: the reference code's constant AdaGrad rate (``learning-rate``).
STEPS = ("auto", "scaled", "fixed")
#: The SVGD kernel's bandwidth: ``median`` (``h = med^2``,
#: :func:`fedbayes_flwr.algorithms.dsvgd.svgd.median_bandwidth`) or ``median-log`` (the median
#: heuristic ``med^2 / log N`` of the paper and the reference code).
SVGD_BANDWIDTHS = ("auto", "median", "median-log")
#: ``auto`` kernel, SVGD bandwidth and step: the new settings (``mahalanobis``, ``median``,
#: ``scaled``) for models other than BNNs and ``mixture-1d`` with at least this many
#: parameters, the paper's below (and for BNNs and ``mixture-1d``): in ``d <= 2`` the paper's
#: are as good or better (``gaussian-mean``, d = 2, 10 Dirichlet clients, 3 passes: median mean
#: error 0.38 sd with the new, within 0.19 with the paper's; ``mixture-1d``: KL 0.39 against
#: 0.03, the covariance-shaped KDE merges the modes).
MODERN_MIN_DIM = 3
#: ... and at most this many: the whitened kernels hold d x d matrices (a covariance, its
#: Cholesky factor and inverse per particle set) and cost O(d^3) per metric; above it ``auto``
#: keeps the paper's isotropic kernels (a 784-100-10 network has d = 79,510: 47 GiB per matrix).
MODERN_MAX_DIM = 1000


class Settings(NamedTuple):
    """The resolved ``kernel``, ``svgd-bandwidth`` and ``step`` of a run."""

    kernel: str
    svgd_bandwidth: str
    step: str


def settings(setup) -> Settings:
    """Resolve the ``auto`` values of ``kernel``, ``svgd-bandwidth`` and ``step`` (see
    :data:`MODERN_MIN_DIM`, :data:`MODERN_MAX_DIM`)."""
    c = setup.config
    dim = (setup.prior.dim if setup.prior is not None  # the memory guard's Setup has no prior
           else setup.model.param_dim(setup.num_features))
    modern = (model_family(setup.model) == "other"
              and MODERN_MIN_DIM <= dim <= MODERN_MAX_DIM)
    return Settings(c.kernel if c.kernel != "auto" else ("mahalanobis" if modern else "isotropic"),
                    c.svgd_bandwidth if c.svgd_bandwidth != "auto" else (
                        "median" if modern else "median-log"),
                    c.step if c.step != "auto" else ("scaled" if modern else "fixed"))
#: ``num-particles = 0`` for models other than BNNs and ``mixture-1d``: ``N = clip(ceil(
#: particles-per-dim * d), 20, MAX_AUTO_PARTICLES)``.
PARTICLES_PER_DIM = 10.0
MAX_AUTO_PARTICLES = 200
#: ``batch-size = -1`` with the ``fixed`` step (the paper's settings).
PAPER_BATCH_SIZE = 100


@dataclass(frozen=True)
class DSVGDConfig:
    """DSVGD hyper-parameters: the run-config section ``[tool.flwr.app.config.dsvgd]``.

    Attributes
    ----------
    variant : str
        ``dsvgd`` (distilled local particles), ``u-dsvgd`` (the unrolled factor) or ``svgd``
        (centralised); set by the algorithm names.
    num_particles : int
        ``N``; 0 = by model: 200 for ``mixture-1d``, 20 for BNNs (the reference), otherwise
        ``clip(ceil(particles_per_dim * d), 20, 200)`` (``d = 11``: 110). Each SVGD iteration
        costs ``O(N^2 d)`` (the kernel matrix) plus ``N`` gradients; a KDE score ``O(N^2 d)``
        per set too, so ``N = 10 d`` costs ``O(d^3)`` per iteration.
    particles_per_dim : float
        The factor of the rule above (10; 0 = 20 particles whatever ``d``, the project's
        earlier default: std 0.3-0.55 of NUTS's in ``d = 6-14``, issue 26).
    kernel : str
        ``mahalanobis`` (default): SVGD in coordinates whitened by the particles' covariance
        (re-estimated every 25 iterations; Wang et al. 2019's constant preconditioner), and KDE
        factors whose kernel is each particle set's own covariance times 0.75 with the centres
        pulled in so the KDE keeps the set's covariance
        (:func:`fedbayes_flwr.inference.kde.matrix_kde`); ``isotropic``: Euclidean kernels and
        ``kde-bandwidth`` (the paper).
    svgd_bandwidth : str
        ``median`` (``h = med^2``, default) or ``median-log`` (``h = med^2 / log N``, the paper;
        under-disperses in more than a few dimensions:
        :func:`fedbayes_flwr.algorithms.dsvgd.svgd.median_bandwidth`).
    step : str
        ``scaled`` (default): AdaGrad with a rate of ``learning_rate`` (0 = 0.1) times the
        particles' current spread, decaying as ``(1 + t / 20)^(-1/2)``
        (:func:`fedbayes_flwr.algorithms.dsvgd.svgd.scaled_svgd`); ``fixed``: the reference
        code's constant rate (see ``learning_rate``).
    guard, guard_retries : bool, int
        The divergence guard: a loop whose particles turn non-finite, spread ten-fold or leave
        by 1e3 spreads is rolled back and rerun with the step 10 times smaller, at most
        ``guard_retries`` (3) times; the history row records ``dsvgd_rollbacks``; a client that
        never recovers is rejected (``diverged``), and a round in which every client, or the
        server's merge, never recovers stops the run.
    local_iterations, distillation_iterations : int
        ``L`` SVGD steps of the local and the distillation loop (200).
    clients_per_round : int
        Clients scheduled each round (1: DSVGD; more: P-DSVGD).
    schedule : str
        ``round-robin`` or ``random`` (seeded, without replacement within a round).
    learning_rate, adagrad_eps : float
        AdaGrad-with-momentum base rate and fudge factor; 0 = auto: BNNs the reference's
        1e-3 and 1e-6; other models a rate of 0.1 times the loop's starting spread (see
        :func:`step_settings`; ``0.05`` reproduces the reference's logistic runs) and 1e-9. With
        ``step = scaled`` the rate is relative to the current spread (0 = 0.1).
    batch_size : int
        Mini-batch rows per SVGD iteration (0 = all rows; -1 = auto: all rows with the
        ``scaled`` step, 100 with ``fixed``, see :func:`batch_size`).
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
    batch_size: int = -1
    kde_bandwidth: str = "auto"
    kde_floor: float = 1e-9
    temperature: float = 1.0
    distillation_start: str = "global"
    kernel: str = "auto"
    svgd_bandwidth: str = "auto"
    step: str = "auto"
    particles_per_dim: float = PARTICLES_PER_DIM
    guard: bool = True
    guard_retries: int = 3

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
        need(self.batch_size >= -1, "batch-size",
             f"must be >= 0 (0 = all rows; -1 = by step rule), got {self.batch_size}")
        need(0 <= self.kde_floor < 1, "kde-floor", f"must be in [0, 1), got {self.kde_floor}")
        need(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        need(self.kernel in KERNELS, "kernel",
             f"unknown kernel {self.kernel!r}; choose one of {', '.join(KERNELS)}")
        need(self.svgd_bandwidth in SVGD_BANDWIDTHS, "svgd-bandwidth",
             f"unknown rule {self.svgd_bandwidth!r}; choose one of {', '.join(SVGD_BANDWIDTHS)}")
        need(self.step in STEPS, "step",
             f"unknown step {self.step!r}; choose one of {', '.join(STEPS)}")
        need(self.particles_per_dim >= 0, "particles-per-dim",
             f"must be >= 0 (0 = the per-model count), got {self.particles_per_dim}")
        need(self.guard_retries >= 0, "guard-retries", f"must be >= 0, got {self.guard_retries}")
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
    """Client -> server: the client's new global particles ``theta_k^(i)``, and its divergence
    guard's record: the SVGD attempts it rolled back, and 1 if a loop never recovered."""

    particles: np.ndarray
    request_round: int
    rollbacks: int = 0
    diverged: int = 0


def num_particles(setup) -> int:
    """``N`` for this run (``num-particles`` or the model's default)."""
    n = setup.config.num_particles
    if n:
        return int(n)
    family = model_family(setup.model)
    per_dim = setup.config.particles_per_dim
    if family != "other" or not per_dim:
        return AUTO_PARTICLES[family]
    dim = (setup.prior.dim if setup.prior is not None  # the memory guard's Setup has no prior
           else setup.model.param_dim(setup.num_features))
    wanted = int(np.ceil(per_dim * dim))
    return int(np.clip(wanted, AUTO_PARTICLES["other"], MAX_AUTO_PARTICLES))


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
    if text in ("auto", "scott", "smooth"):
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
    return minibatch_grad(rng, x, data, setup, batch_size(setup)) / setup.config.temperature


def batch_size(setup) -> int:
    """Rows per SVGD iteration: ``batch-size``, or with ``-1`` (auto) all rows for the ``scaled``
    step and the paper's 100 for the ``fixed`` one. Mini-batch scores rescaled by ``n_k / B``
    are noisy, and SVGD has no correction for the noise: centralised SVGD over-disperses on the
    skewed logistic case of ``benchmarks/dsvgd/dsvgd_defaults.py`` (std 1.6-1.9 of NUTS's with
    100-row batches of 2,000, 0.95-0.98 with all rows)."""
    config = setup.config
    if config.batch_size >= 0:
        return int(config.batch_size)
    return 0 if settings(setup).step == "scaled" else PAPER_BATCH_SIZE


def _ratio(numerators, denominators, setup,
           pair_all: bool = False) -> tuple[list[KDE], list[KDE]]:
    """The KDEs of ``prod KDE(numerators) / prod KDE(denominators)`` under
    ``dsvgd.kde-bandwidth`` (:func:`fedbayes_flwr.algorithms.dsvgd.svgd.ratio_kdes`; ``auto`` pairs and
    shrinks).
    The callers order the sets so partners are the two particle sets of one visit (the received
    and the returned global particles) or the cavity's ``q`` and ``t_k^(0)``."""
    rule = bandwidth_rule(setup.config)
    if rule == "smooth":
        num = [smooth_kde(c) for c in numerators]
        top = max((k.bandwidth for k in num), default=0.0)
        partners = [top] * len(denominators) if pair_all else (
            [k.bandwidth for k in num[:len(denominators)]]
            + [0.0] * max(0, len(denominators) - len(num)))
        return num, [smooth_kde(c, min_bandwidth=p) for c, p in zip(denominators, partners,
                                                                     strict=True)]
    if rule == "auto":
        return ratio_kdes(numerators, denominators, "auto", paired=True, pair_all=pair_all)
    return ratio_kdes(numerators, denominators, "auto" if rule == "scott" else rule,
                      paired=False)


def _score(x, kdes_num, kdes_den, floor: float) -> np.ndarray:
    return log_ratio_score(x, kdes_num, kdes_den, floor)


def _matrix(setup) -> bool:
    """KDE factors with each set's own covariance as kernel shape (:func:`matrix_kde`):
    ``kernel = mahalanobis`` with ``kde-bandwidth = auto``."""
    return settings(setup).kernel == "mahalanobis" and str(setup.config.kde_bandwidth) == "auto"


def _matrix_score(x, numerators, denominators, floor: float) -> np.ndarray:
    out = np.zeros_like(x)
    for k in numerators:
        out = out + matrix_kde_score(x, k, floor)
    for k in denominators:
        out = out - matrix_kde_score(x, k, floor)
    return out


def _metric(sets, setup) -> Whitening:
    """The loop's coordinates: whitened by ``sets``' mean and average covariance
    (``kernel = mahalanobis``) or the identity (``isotropic``, the paper: ``z = x`` exactly)."""
    if settings(setup).kernel == "mahalanobis":
        return whitening(sets)
    return Whitening.identity(np.asarray(sets[0]).shape[1])


def _model_score(metric: Whitening, fn):
    """``grad_z`` of a log density given by its ``grad_x`` ``fn``."""
    return lambda z: metric.score_to_z(fn(metric.to_x(z)))


#: ``kernel = mahalanobis``: loops whose metric follows their particles re-estimate it (and
#: rebuild their target's KDEs in the new coordinates) every this many iterations.
SEGMENT = 25


def _loop(start: np.ndarray, make_target, iterations: int, setup, metric_sets=None,
          reports: list | None = None) -> np.ndarray:
    """One SVGD loop from ``start`` (x coordinates), the support projection after every step and
    the divergence guard (:func:`fedbayes_flwr.algorithms.dsvgd.svgd.guarded_svgd`, its report
    appended to ``reports``); returns the particles in x coordinates.

    ``make_target(metric)`` is the target's score in ``metric``'s coordinates. The metric
    (:func:`_metric`) is that of ``metric_sets``, fixed, or with ``metric_sets`` None that of
    the current particles, re-estimated every :data:`SEGMENT` iterations (``kernel =
    isotropic``: the identity, one segment).
    """
    config = setup.config
    support = getattr(setup.model, "support", None)
    resolved = settings(setup)
    follow = metric_sets is None and resolved.kernel == "mahalanobis"
    first = _metric([start] if metric_sets is None else metric_sets, setup)
    scale = MEDIAN_BANDWIDTH_SCALE if resolved.svgd_bandwidth == "median" else None

    def segment(x, metric, score_fn, n, t0, factor):
        z0 = metric.to_z(x)

        def proj(z):
            return metric.to_z(project(metric.to_x(z), setup))

        if resolved.step == "scaled":
            return metric.to_x(scaled_svgd(
                z0, score_fn, n, relative=(config.learning_rate or SCALED_STEP) * factor,
                eps=config.adagrad_eps or 1e-9, project=proj if support is not None else None,
                bandwidth_scale=scale, t0=t0))
        lr, eps = step_settings(setup, z0)
        if support is None:
            return metric.to_x(svgd(z0, score_fn, n, lr * factor, eps, bandwidth_scale=scale))
        z = z0
        for _ in range(n):  # one step per call: project between steps
            z = proj(svgd(z, score_fn, 1, lr * factor, eps, bandwidth_scale=scale))
        return metric.to_x(z)

    def run(factor: float) -> np.ndarray:
        x, metric, t = start, first, 0
        while t < iterations:
            n = min(SEGMENT, iterations - t) if follow else iterations
            if follow and t:
                metric = _metric([x], setup)
            x = segment(x, metric, make_target(metric), n, t, factor)
            t += n
            if not np.all(np.isfinite(x)):
                break
        return first.to_z(x)

    z0 = first.to_z(start)
    if config.guard:
        z, report = guarded_svgd(run, z0, retries=config.guard_retries,
                                 check=lambda z: _far_from_prior(first.to_x(z), setup))
    else:
        z, report = run(1.0), LoopReport(1.0, 0, ())
    if reports is not None:
        reports.append(report)
    return first.to_x(z)


#: The guard's bound in prior units: a particle farther than this many prior sds from the prior
#: mean (in any coordinate) counts as diverged (a posterior that far out means a prior that
#: contradicts the data by 20 sd).
PRIOR_RADIUS = 20.0


def _far_from_prior(x: np.ndarray, setup) -> str | None:
    if not getattr(setup.model, "gaussian_prior", True):
        return None
    prior = setup.prior
    try:
        mean, cov = G.to_moments(prior)
    except Exception:  # a prior without moments: no bound
        return None
    sd = np.sqrt(np.diag(np.atleast_2d(cov))) if np.ndim(cov) == 2 else np.sqrt(np.asarray(cov))
    radius = float(np.max(np.abs(x - mean) / sd))
    return f"a particle {radius:.3g} prior sds out" if radius > PRIOR_RADIUS else None


def _unrecovered(report: LoopReport, setup) -> bool:
    return bool(setup.config.guard and len(report.reasons) > setup.config.guard_retries)


# ---------------------------------------------------------------------------- the maths
def local_update(seed, factor: Factor, particles: np.ndarray, data, setup,
                 reports: list | None = None) -> np.ndarray:
    """The local SVGD loop: ``theta^(i-1) -> theta_k^(i)`` towards the tilted cavity (eq. 5).

    Target score ``grad log q^(i-1) - grad log t_k^(i-1) + grad log p0 - grad L_k / alpha``; the
    ``svgd`` variant drops the two KDE terms. Metric: ``theta^(i-1)``'s covariance.
    """
    config = setup.config
    rng = numpy_rng(seed)
    floor = config.kde_floor

    if config.variant != "svgd" and _matrix(setup):
        mnum, mden = matrix_ratio_kdes([particles, *factor.denominators],
                                       list(factor.numerators))

    def make_target(metric):
        if config.variant != "svgd" and _matrix(setup):
            return _model_score(metric, lambda x: _matrix_score(x, mnum, mden, floor)
                                + prior_score(setup, x) + likelihood_score(rng, x, data, setup))
        if config.variant == "svgd":
            num, den = [], []
        else:
            num, den = _ratio([metric.to_z(s) for s in [particles, *factor.denominators]],
                              [metric.to_z(s) for s in factor.numerators], setup)
        model = _model_score(metric, lambda x: prior_score(setup, x)
                             + likelihood_score(rng, x, data, setup))
        return lambda z: _score(z, num, den, floor) + model(z)

    return _loop(particles, make_target, config.local_iterations, setup, None, reports)


def distil(factor: Factor, old_global: np.ndarray, new_global: np.ndarray, setup,
           reports: list | None = None) -> Factor:
    """The new factor ``t_k^(i) ∝ q_k^(i) t_k^(i-1) / q^(i-1)`` (eq. 7).

    DSVGD: the distillation SVGD loop moves the local particles towards it (metric: the new
    global particles' covariance). U-DSVGD: the ratio is kept exactly (two more particle sets).
    """
    config = setup.config
    if config.variant == "u-dsvgd":
        return Factor(np.concatenate([factor.numerators, new_global[None]]),
                      np.concatenate([factor.denominators, old_global[None]]))
    if config.variant == "svgd":
        return factor
    if _matrix(setup):
        mnum, mden = matrix_ratio_kdes([new_global, *factor.numerators],
                                       [old_global, *factor.denominators])

    def make_target(metric):
        if _matrix(setup):
            return _model_score(metric, lambda x: _matrix_score(x, mnum, mden, config.kde_floor))
        num, den = _ratio([metric.to_z(s) for s in [new_global, *factor.numerators]],
                          [metric.to_z(s) for s in [old_global, *factor.denominators]], setup)
        return lambda z: _score(z, num, den, config.kde_floor)

    start = new_global if config.distillation_start == "global" else factor.numerators[0]
    local = _loop(start, make_target, config.distillation_iterations, setup, [new_global],
                  reports)
    return Factor(local[None], factor.denominators)


def server_merge(old: np.ndarray, uploads: list[np.ndarray], setup,
                 reports: list | None = None) -> np.ndarray:
    """P-DSVGD's data-free server loop towards ``KDE(old)^(1 - S) prod_k KDE(theta_k)``; with one
    upload, that upload itself (DSVGD).

    The numerators' kernel terms are not floored (the denominator's are, at ``kde-floor``):
    floored, each upload's KDE is flat, its score zero, beyond about ``6.4`` bandwidths of its
    particles, so wherever the uploads' clouds do not overlap (label-skewed clients) nothing
    pulls the particles and ``- (S - 1) grad log KDE(old)`` pushes them out of the old cloud for
    the whole loop: the round-1 blow-up of issue 26 (10 clients, logistic regression, ``d = 11``:
    spread 11.5 against a posterior sd of 0.12 from one merge; 0.05 without the numerators'
    floor). Metric: the uploads' average covariance, the scale of the target.
    """
    if len(uploads) == 1:
        return uploads[0]
    weight = len(uploads) - 1
    floor = setup.config.kde_floor

    if _matrix(setup):
        mnum, (mold,) = matrix_ratio_kdes(uploads, [old], pair_all=True)

    def make_target(metric):
        if _matrix(setup):
            return _model_score(metric, lambda x: _matrix_score(x, mnum, [], 0.0)
                                - weight * matrix_kde_score(x, mold, floor))
        num, (old_kde,) = _ratio([metric.to_z(u) for u in uploads], [metric.to_z(old)], setup,
                                 pair_all=True)

        def target(x):
            return _score(x, num, [], 0.0) - weight * kde_score(x, old_kde.centres,
                                                                old_kde.bandwidth, floor)
        return target

    return _loop(old, make_target, setup.config.local_iterations, setup, uploads, reports)


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
    reports: list[LoopReport] = []
    new = local_update(seed, state.value, message.particles, data, setup, reports)
    factor = distil(state.value, message.particles, new, setup, reports)
    rollbacks = sum(r.rollbacks for r in reports)
    diverged = int(any(_unrecovered(r, setup) for r in reports))
    return (commit.propose(state, factor, message.server_round),
            Up(new, message.server_round, rollbacks, diverged), {})


def _server_step(state: ServerState, replies, setup, rnd):
    accepted, rejected, uploads = [], [], []
    acc = state.accepted_round
    client_rollbacks = 0
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        client_rollbacks += int(reply.rollbacks)
        uploads.append(reply.particles)
        accepted.append(pid)
        acc = commit.record_accepted(acc, pid, reply.request_round)
    where = f"update {getattr(rnd, 'number', state.server_round + 1)}"
    if not uploads and any(r.field == "diverged" for r in rejected):
        raise RunStopped(f"{where}: every client's SVGD loop diverged after "
                         f"{setup.config.guard_retries} step reductions ({rejected[0].reason}); "
                         "the run stops (lower dsvgd.learning-rate)")
    reports: list[LoopReport] = []
    particles = server_merge(state.particles, uploads, setup, reports) if uploads else state.particles
    diagnostics: dict = {}
    if reports and _unrecovered(reports[0], setup):
        raise RunStopped(f"{where}: the server merge diverged after {setup.config.guard_retries} "
                         f"step reductions ({reports[0].reasons[-1]}); the run stops")
    server_rollbacks = sum(r.rollbacks for r in reports)
    if setup.config.guard:
        diagnostics["dsvgd_rollbacks"] = client_rollbacks + server_rollbacks
        if server_rollbacks:
            diagnostics["dsvgd_guard"] = (f"server merge rolled back {server_rollbacks}x "
                                          f"({reports[0].reasons[0]}), step x{reports[0].step_factor:g}")
        elif client_rollbacks:
            diagnostics["dsvgd_guard"] = f"client loops rolled back {client_rollbacks}x"
    return (ServerState(particles, state.server_round + 1, acc),
            StepInfo(updates=1, accepted=tuple(accepted), rejected=tuple(rejected),
                     diagnostics=diagnostics))


def _posterior(state: ServerState, setup):
    """The global particles, flagged ``stein_diagnostic``: the recorder adds their kernel Stein
    discrepancy to the target
    (:func:`fedbayes_flwr.evaluation.sample_quality.kernel_stein_discrepancy`) to each history
    row's diagnostics, so a collapsed or diverged cloud is visible without a reference."""
    posterior = SamplePosterior(state.particles)
    posterior.stein_diagnostic = True  # type: ignore[attr-defined]
    return posterior


def _actions(setup) -> dict[str, ActionSpec]:
    z = np.zeros((num_particles(setup), setup.prior.dim))
    return {TRAIN: ActionSpec("train", Down(z, 0, 0), Up(z, 0, 0, 0))}


def _client_state_template(setup) -> commit.Pending:
    """Template of the stored client state; U-DSVGD's factor grows by one set per visit (the
    stored state is loaded by rank, not shape)."""
    z = np.zeros((1, num_particles(setup), setup.prior.dim))
    return commit.init(Factor(z, _empty(setup)))


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """A client whose SVGD loops never recovered is refused; particles must be finite, lie in a
    bounded prior's support and within ``2**26`` prior standard deviations of the prior mean
    (:func:`fedbayes_flwr.algorithms.bounds.position_error`)."""
    if int(getattr(reply, "diverged", 0)):
        return "diverged", "its SVGD loop diverged at every step size tried"
    if not np.all(np.isfinite(reply.particles)):
        return "particles", "non-finite particles"
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
    (the SVGD kernel and the KDE ratios). U-DSVGD's factors grow by two sets per visit on top.
    With ``kernel = mahalanobis`` each KDE factor and loop metric also holds ``d x d`` matrices
    (a covariance, its Cholesky factor and inverse): ``3 (K + 2) d^2`` more."""
    k, n = setup.num_clients, num_particles(setup)
    d = setup.model.param_dim(setup.num_features)
    count = (2 * k + 6) * n * d + 4 * n * n
    formula = "(2 K + 6) N d + 4 N^2"
    alternative = "use fewer particles (dsvgd.num-particles) or fewer clients"
    if settings(setup).kernel == "mahalanobis":
        count += 3 * (k + 2) * d * d
        formula += " + 3 (K + 2) d^2 (kernel mahalanobis)"
        alternative = "use dsvgd.kernel='isotropic' (no d x d matrices) or fewer particles"
    return MemoryEstimate(count * 8, f"{formula} float64s, K = {k}, N = {n}, d = {d}",
                          alternative)


BUNDLE = Bundle(
    name="dsvgd", config_class=DSVGDConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, corrupt=_corrupt, prior_diag=_prior_diag,
    memory_estimate=_memory_estimate)


# ---------------------------------------------------------------------------- presets
def _paper(c):
    """The paper's (and the project's earlier) settings: Euclidean kernels, the reference code's
    constant AdaGrad rate, 20 particles for linear models (the guard stays on: it acts only on a
    diverged loop)."""
    return c.with_section(kernel="isotropic", step="fixed", particles_per_dim=0.0,
                          svgd_bandwidth="median-log")


def _u_dsvgd(c):
    return c.with_section(variant="u-dsvgd")


def _p_dsvgd(c):
    return c.with_section(variant="dsvgd", clients_per_round=c.num_clients)


def _svgd(c):  # one client holding every row: the data never leave in a real federation
    return c.replace(num_clients=1).with_section(variant="svgd", clients_per_round=1)


def _then_paper(preset):
    return lambda c: _paper(preset(c) if preset is not None else c)


PRESETS = {
    "dsvgd": (None, "DSVGD: particles go down and up; clients keep N distilled local particles"),
    "u-dsvgd": (_u_dsvgd, "U-DSVGD: the unrolled KDE-ratio factor (client memory grows)"),
    "p-dsvgd": (_p_dsvgd, "parallel DSVGD: every client each round, a data-free server merge"),
    "svgd": (_svgd, "centralised SVGD on the pooled data, the same I x L iterations"),
}
PRESETS.update({
    f"{name}-paper": (_then_paper(preset), f"{name} with the paper's settings (Euclidean kernels, "
                                           "constant AdaGrad rate, 20 particles)")
    for name, (preset, _) in list(PRESETS.items())})


def registrations():
    """``(name, bundle, preset, description)`` for DSVGD and its SVGD baselines."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
