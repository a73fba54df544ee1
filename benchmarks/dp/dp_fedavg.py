"""DP-FedAvg, the baseline of issue 29: the maths, the accountants and the in-process replica.

Two guarantees, two algorithms; both start from the project's FedAvg point estimate
(:mod:`fedbayes_flwr.algorithms.fedavg`: Adam ascent on
``log p(D_k | theta) + log p0(theta) / K`` from the received ``theta``) on the project's data and
partitions (:func:`fedbayes_flwr.runtime.experiment.build_experiment`, so the split is the one
DP-PVI sees for the same seed), from the point PVI's local optimisation starts at
(:func:`initial_theta`):

**Client-level DP-FedAvg** (``client-level``; McMahan et al. 2018, Algorithm 1 with every client
each round): what Flower's own ``DifferentialPrivacyClientSideFixedClipping`` wrapper around
``FedAvg``, with ``fixedclipping_mod`` on the clients, computes (:mod:`flower_app` runs exactly
that through the Simulation Engine). Each client trains without privacy, ``fixedclipping_mod``
clips its update ``theta_k - theta`` to norm ``C``, the server takes the unweighted mean
(Flower's accountant requires equal client weights) and adds ``N(0, (sigma C / K)^2)`` to every
coordinate. Neighbouring datasets differ in one *client's whole data*; with all ``K`` clients in
every round there is no sampling amplification, so ``R`` rounds are ``R`` Gaussian mechanisms of
noise multiplier ``sigma`` (``dp_accounting``'s RDP, add-or-remove-one; Flower's own
``RdpAccountant`` with ``no-amplification``, the same library, reports the same number).

**Record-level DP-FedAvg** (``record-level``; Abadi et al. 2016, Algorithm 1, run locally by each
client): each local step Poisson-samples a lot with rate ``q_k = L_k / n_k`` (``L_k = min(L,
n_k)``; ``L = 0``: the full batch, ``q_k = 1``, as DP-PVI's ``pvi.batch-size = 0``), clips every
per-example gradient of ``log p(y_i | theta)`` to norm ``C`` and adds ``N(0, sigma_k^2 C^2)`` to
their sum; ``n_k / L_k`` times that (the full-data gradient's estimate, normalised by the expected
lot) plus the data-free prior share drives Adam. Neighbouring datasets differ in one *record* of
one client, the guarantee DP-PVI gives; each client is accounted over all its ``R S`` steps
(``PoissonSampledDpEvent(q_k, GaussianDpEvent(sigma_k))`` composed ``R S`` times) and calibrates
its own ``sigma_k`` to the target. The server's ``n_k``-weighted mean is post-processing; ``n_k``
is treated as public (as Abadi et al.'s normalisation by the expected lot ``q n`` does).

Noise multipliers are calibrated with ``dp_accounting.calibrate_dp_mechanism`` over an
``RdpAccountant`` (record level: integer orders, :data:`RECORD_ORDERS`), never by a formula.
``epsilon = inf`` is the non-private method: no clipping, no noise.

References
----------
McMahan, Ramage, Talwar & Zhang (2018), "Learning Differentially Private Recurrent Language
Models", Algorithm 1 (DP-FedAvg, flat clipping, noise ``sigma C`` on the sum of updates).
Abadi et al. (2016), "Deep Learning with Differential Privacy", Algorithm 1 (DP-SGD) and
Section 3.1 (the moments accountant). Mironov, Talwar & Zhang (2019), "Renyi Differential Privacy
of the Sampled Gaussian Mechanism" (the RDP of the Poisson-subsampled Gaussian that
``dp_accounting.rdp`` computes).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import dp_accounting
import numpy as np
from dp_accounting import rdp

from fedbayes_flwr.algorithms import fedavg
from fedbayes_flwr.algorithms.particles import prior_score
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import Experiment, build_experiment
from fedbayes_flwr.seeds import derive_seed, numpy_rng

VARIANTS = ("client-level", "record-level")
GUARANTEE = {
    "client-level": "client-level (epsilon, delta)-DP: neighbouring federations differ in one "
                    "client's whole data set; accounted over rounds (all 10 clients each round, "
                    "no sampling amplification)",
    "record-level": "record-level (epsilon, delta)-DP for each client's data (neighbouring data "
                    "sets differ in one record of one client), the guarantee DP-PVI gives; "
                    "accounted over all local DP-SGD steps of all rounds, Poisson lots, worst "
                    "client reported",
}
ADAM_BETAS, ADAM_EPS = fedavg.ADAM_BETAS, fedavg.ADAM_EPS


class Problem(NamedTuple):
    """One benchmark problem: the project's run config (data, model, split) and the DP-FedAvg
    optimiser settings."""

    name: str
    run_config: dict
    rounds: int
    local_steps: int
    learning_rate: float
    lot_size: int          # expected lot L (q_k = min(L, n_k) / n_k; 0: full batch); client level: batch
    record_clip: float     # per-example gradient clip (record level)
    client_clip: float     # update clip (client level, Flower's clipping_norm)


class Outcome(NamedTuple):
    theta: np.ndarray
    metrics: dict
    epsilon: float          # accountant's epsilon spent (worst client for record level)
    noise_multiplier: float | list
    history: list


# ---------------------------------------------------------------------------- the experiment
def experiment(problem: Problem, seed: int) -> Experiment:
    """The project's data, partitions, model and prior for ``problem`` and ``seed`` (the FedAvg
    bundle's setup: its prior's diagonal Gaussian, 10 clients)."""
    return build_experiment(parse_run_config({"algorithm": "fedavg", **problem.run_config,
                                              "seed": int(seed)}))


def evaluate_posterior(exp: Experiment, posterior) -> dict:
    """Test accuracy, NLL, ECE (and the rest) of ``posterior``'s predictive through the model's
    ``metrics`` (:mod:`fedbayes_flwr.evaluation.predictive`): the same function for DP-PVI's
    Gaussian and for FedAvg's point estimate."""
    metrics, _ = exp.model.metrics(posterior, exp.dataset.x_test, exp.dataset.y_test)
    return {k: float(v) for k, v in metrics.items()}


def evaluate(exp: Experiment, theta: np.ndarray) -> dict:
    """:func:`evaluate_posterior` of the plug-in predictive of ``theta``: a point estimate is the
    delta posterior, a one-draw :class:`SamplePosterior`."""
    return evaluate_posterior(exp, SamplePosterior(np.asarray(theta, np.float64)[None]))


def initial_theta(exp: Experiment) -> np.ndarray:
    """Where DP-FedAvg starts: the mean PVI's local optimisation starts from at the prior
    (``model.local_init``: the prior mean, zero, for logistic regression; the model's fixed-seed
    He initialisation for a BNN), so both methods start from the same point."""
    return G.to_moments(exp.model.local_init(exp.prior, exp.setup.num_features))[0].astype(np.float64)


def client_seed(seed: int, variant: str, server_round: int, partition_id: int) -> np.ndarray:
    """The stateless seed of one client's local problem: from the run seed, the variant, the
    round and the partition id (never from message order), the same in-process and in Flower."""
    return derive_seed(int(seed), f"dp-fedavg.{variant}", int(server_round), int(partition_id))


# ---------------------------------------------------------------------------- accountants
# Record level: integer RDP orders only. ``dp_accounting``'s default orders add fractional ones
# (1.1 ... 10.9) whose subsampled-Gaussian series often fails to converge at large noise (1000
# iterations, then the order is dropped), which made one calibration cost seconds; any set of orders
# gives a valid bound, and on this benchmark's settings the integer orders' noise multiplier is within
# 0.5 % of the default orders' (measured: 28.6815 vs 28.6815 at q=0.5, 200 steps, epsilon 1; 1.9302
# vs 1.9213 at q=0.19, 200 steps, epsilon 8), i.e. slightly more noise for DP-FedAvg, never less.
RECORD_ORDERS = (*range(2, 65), 128, 256, 512, 1024)


def _rdp_accountant(orders=None) -> rdp.RdpAccountant:
    """An RDP accountant, add-or-remove-one (``orders=None``: dp_accounting's defaults, as Flower's
    own accountant uses)."""
    return rdp.RdpAccountant(orders=None if orders is None else list(orders),
                             neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)


def client_level_event(noise_multiplier: float, rounds: int) -> dp_accounting.DpEvent:
    """``rounds`` Gaussian releases of the clipped-update sum, every client every round."""
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)


def record_level_event(noise_multiplier: float, q: float, steps: int) -> dp_accounting.DpEvent:
    """``steps`` Poisson-subsampled (rate ``q``) Gaussian releases of a client's clipped
    gradient sum."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)


def epsilon_of(event: dp_accounting.DpEvent, delta: float, orders=None) -> float:
    """``dp_accounting``'s RDP epsilon of ``event`` at ``delta``."""
    acc = _rdp_accountant(orders)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def calibrate(event_of_sigma, epsilon: float, delta: float, orders=None) -> float:
    """The smallest noise multiplier whose event spends at most ``epsilon`` at ``delta``
    (``dp_accounting.calibrate_dp_mechanism`` over an RDP accountant with ``orders``)."""
    sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: _rdp_accountant(orders), event_of_sigma, epsilon, delta,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)))
    # Brent's method stops within its tolerance on the budget side; checked, not assumed
    if epsilon_of(event_of_sigma(sigma), delta, orders) > epsilon:
        raise RuntimeError(f"calibration gave sigma={sigma} over epsilon={epsilon}")
    return sigma


def lot(problem: Problem, n: int) -> int:
    """The client's expected lot ``L_k = min(L, n_k)``; ``L = 0``: the full batch ``n_k``
    (``q = 1``, as ``pvi.batch-size = 0``)."""
    return n if problem.lot_size <= 0 else min(problem.lot_size, n)


# ---------------------------------------------------------------------------- local problems
def _adam(x, m, v, t, grad, lr):
    b1, b2 = ADAM_BETAS
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    return x + lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + ADAM_EPS), m, v


def local_train(seed, theta: np.ndarray, data, exp: Experiment, problem: Problem) -> np.ndarray:
    """Client level: FedAvg's non-private local problem (Adam on mini-batches of ``L`` rows drawn
    without replacement, the likelihood rescaled by ``n_k / L``, plus ``log p0 / K``)."""
    rng = numpy_rng(seed)
    x = theta.astype(np.float64).copy()
    m, v = np.zeros_like(x), np.zeros_like(x)
    n = data.x.shape[0]
    for t in range(1, problem.local_steps + 1):
        b = lot(problem, n)
        idx = rng.choice(n, size=b, replace=False)
        g = exp.model.per_datum_grads(x, data.x, data.y, idx).sum(axis=0) * (n / b)
        grad = g + prior_score(exp.setup, x[None])[0] / exp.num_clients
        x, m, v = _adam(x, m, v, t, grad, problem.learning_rate)
    return x


def clip_rows(g: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled to norm at most ``clip`` (Abadi et al. 2016, Algorithm 1, "clip gradient")."""
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    return g * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def dp_sgd_train(seed, theta: np.ndarray, data, exp: Experiment, problem: Problem,
                 noise_multiplier: float | None) -> np.ndarray:
    """Record level: DP-SGD on the local problem; ``noise_multiplier = None`` is the non-private
    run (the same Poisson lots, no clipping, no noise)."""
    rng = numpy_rng(seed)
    x = theta.astype(np.float64).copy()
    m, v = np.zeros_like(x), np.zeros_like(x)
    n = data.x.shape[0]
    b = lot(problem, n)
    q = b / n
    for t in range(1, problem.local_steps + 1):
        idx = np.flatnonzero(rng.random(n) < q)  # Poisson sampling with rate q
        g = exp.model.per_datum_grads(x, data.x, data.y, idx) if idx.size else np.zeros((0, x.size))
        if noise_multiplier is not None:
            g = clip_rows(g, problem.record_clip)
        total = g.sum(axis=0)
        if noise_multiplier is not None:
            total = total + rng.normal(0.0, noise_multiplier * problem.record_clip, x.size)
        grad = total * (n / b) + prior_score(exp.setup, x[None])[0] / exp.num_clients
        x, m, v = _adam(x, m, v, t, grad, problem.learning_rate)
    return x


def clip_update(theta_k: np.ndarray, theta: np.ndarray, clip: float) -> np.ndarray:
    """``fixedclipping_mod``'s flat clipping: ``theta + (theta_k - theta) min(1, C / ||.||)``
    (Flower's ``compute_clip_model_update``)."""
    delta = theta_k - theta
    return theta + delta * min(1.0, clip / np.linalg.norm(delta))


# ---------------------------------------------------------------------------- the runs
def client_level_sigma(problem: Problem, epsilon: float, delta: float) -> float | None:
    return None if math.isinf(epsilon) else calibrate(
        lambda s: client_level_event(s, problem.rounds), epsilon, delta)


def run_client_level(problem: Problem, seed: int, epsilon: float, delta: float,
                     noise_seed: int | None = None) -> Outcome:
    """In-process replica of Flower's ``DifferentialPrivacyClientSideFixedClipping(FedAvg)``
    with ``fixedclipping_mod`` (the same maths and the same random numbers: the server's noise
    comes from ``numpy.random.RandomState(noise_seed)``, which is what Flower's
    ``np.random.normal`` draws after ``np.random.seed(noise_seed)``)."""
    exp = experiment(problem, seed)
    sigma = client_level_sigma(problem, epsilon, delta)
    noise = np.random.RandomState(seed if noise_seed is None else noise_seed)
    theta = initial_theta(exp)
    k = exp.num_clients
    history = []
    for r in range(1, problem.rounds + 1):
        thetas = []
        for pid in range(k):
            theta_k = local_train(client_seed(seed, "client-level", r, pid), theta,
                                  exp.client_data(pid), exp, problem)
            thetas.append(theta_k if sigma is None else clip_update(theta_k, theta, problem.client_clip))
        theta = np.mean(np.stack(thetas), axis=0)
        if sigma is not None:
            theta = theta + noise.normal(0, sigma * problem.client_clip / k, theta.shape)
        spent = 0.0 if sigma is None else epsilon_of(client_level_event(sigma, r), delta)
        history.append({"round": r, "dp_epsilon": spent, **evaluate(exp, theta)})
    eps = math.inf if sigma is None else history[-1]["dp_epsilon"]
    return Outcome(theta, evaluate(exp, theta), eps, sigma, history)


def record_level_sigmas(exp: Experiment, problem: Problem, epsilon: float,
                        delta: float) -> list[float | None]:
    """Each client's own noise multiplier for ``epsilon`` over its ``R S`` steps."""
    if math.isinf(epsilon):
        return [None] * exp.num_clients
    steps = problem.rounds * problem.local_steps
    out = []
    for pid in range(exp.num_clients):
        n = len(exp.partitions[pid])
        q = lot(problem, n) / n
        out.append(calibrate(lambda s, q=q: record_level_event(s, q, steps), epsilon, delta,
                             RECORD_ORDERS))
    return out


def run_record_level(problem: Problem, seed: int, epsilon: float, delta: float) -> Outcome:
    """Record-level DP-FedAvg: every client DP-SGD locally, the server the ``n_k``-weighted mean."""
    exp = experiment(problem, seed)
    sigmas = record_level_sigmas(exp, problem, epsilon, delta)
    theta = initial_theta(exp)
    k = exp.num_clients
    sizes = [len(p) for p in exp.partitions]
    qs = [lot(problem, n) / n for n in sizes]
    history = []
    for r in range(1, problem.rounds + 1):
        thetas = [dp_sgd_train(client_seed(seed, "record-level", r, pid), theta,
                               exp.client_data(pid), exp, problem, sigmas[pid]) for pid in range(k)]
        theta = fedavg.weighted_mean(thetas, sizes)
        spent = 0.0 if sigmas[0] is None else max(
            epsilon_of(record_level_event(s, q, r * problem.local_steps), delta, RECORD_ORDERS)
            for s, q in zip(sigmas, qs, strict=True))
        history.append({"round": r, "dp_epsilon": spent, **evaluate(exp, theta)})
    eps = math.inf if sigmas[0] is None else history[-1]["dp_epsilon"]
    return Outcome(theta, evaluate(exp, theta), eps, sigmas, history)


RUNNERS = {"client-level": run_client_level, "record-level": run_record_level}
