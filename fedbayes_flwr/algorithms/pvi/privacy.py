"""DP-PVI's privacy accounting: the sampling rate, the noise calibration and the epsilon spent.

Each client's local solve is DP-SGD (:func:`fedbayes_flwr.inference.vi.fit_gaussian_dp_sgd`):
every step is the Poisson-subsampled Gaussian mechanism on the client's rows, with sampling rate
``q_k = batch-size / n_k`` (``q = 1`` for the full batch) and noise multiplier ``sigma``. Every
local step of every round a client takes part in composes; the released factor change is a
post-processing of the DP-SGD iterates (Heikkila et al. 2023, Section 4), so its privacy is
DP-SGD's. The accountant is Google's ``dp-accounting`` library: its RDP accountant
(:class:`dp_accounting.rdp.RdpAccountant`, add-or-remove-one neighbouring) on
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` self-composed over the steps, and
:func:`dp_accounting.calibrate_dp_mechanism` for the calibration; no formula is written here.

Calibration is per client: client ``k`` takes the smallest ``sigma_k`` (within 1e-5) whose
epsilon after the planned run (:func:`planned_steps`) is at most the target, from its own
``n_k``. The server, which learns ``n_k`` from the replies (``num_examples``), recomputes the
same ``sigma_k`` and the epsilon spent.

References
----------
Heikkila, Ashman, Swaroop, Turner & Honkela (2023), "Differentially private partitioned
variational inference", TMLR, Section 4 (DP-SGD clients). Abadi et al. (2016), "Deep Learning
with Differential Privacy", CCS, Algorithm 1 and Section 3.1. Mironov (2017), "Renyi
Differential Privacy"; Mironov, Talwar & Zhang (2019), "Renyi Differential Privacy of the
Sampled Gaussian Mechanism".
"""

from __future__ import annotations

import functools
import math

from fedbayes_flwr.algorithms.pvi.config import PVIConfig

ORDERS = (*range(2, 65), 80, 96, 128, 192, 256)
"""The Renyi orders the accountant evaluates: integers, where ``dp-accounting`` computes the
sampled Gaussian's RDP exactly (its fractional orders can fail to converge for large ``q`` and
are then dropped with a warning). The best order for a target ``epsilon`` at ``delta`` is near
``1 + log(1 / delta) / epsilon`` (about 24 for ``epsilon = 0.5, delta = 1e-5``), well inside;
orders above 256 (the library's default goes to 1024) only matter for ``epsilon`` below about
0.05 and cost most of the time of a calibration."""
CALIBRATION_TOL = 1e-5
"""Brent's tolerance on the noise multiplier (absolute)."""


def sampling_rate(batch_size: int, num_examples: int) -> float:
    """``q = batch-size / n_k``: each row joins a step's lot with this probability (Poisson
    sampling); the full batch (``batch-size = 0``) is ``q = 1``. A batch larger than the data
    is refused before the run (:meth:`PVIConfig.validate_partitions`)."""
    if batch_size <= 0:
        return 1.0
    return min(1.0, batch_size / num_examples)


def planned_participations(config: PVIConfig, num_clients: int, num_rounds: int) -> int:
    """The rounds a client takes part in over ``num_rounds`` rounds: all of them
    (synchronous), at most ``ceil(num_rounds / M)`` (sequential: each client once per pass)."""
    if config.schedule == "sequential":
        return -(-num_rounds // num_clients)
    return num_rounds


def planned_steps(config: PVIConfig, num_clients: int) -> int:
    """Local DP-SGD steps a client takes over the planned run (``dp-rounds``)."""
    return planned_participations(config, num_clients, config.dp_rounds) * config.local_steps


def _event(q: float, sigma: float, steps: int):
    import dp_accounting

    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(step, steps)


@functools.lru_cache(maxsize=4096)
def epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``steps`` Poisson-subsampled Gaussian steps (rate ``q``,
    noise multiplier ``sigma``), by ``dp-accounting``'s RDP accountant at :data:`ORDERS`; 0 for no steps."""
    if steps <= 0:
        return 0.0
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(ORDERS)
    accountant.compose(_event(q, sigma, steps))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=1024)
def calibrate(q: float, steps: int, target_epsilon: float, delta: float) -> float:
    """The noise multiplier for ``steps`` steps at rate ``q`` to spend at most
    ``target_epsilon`` at ``delta`` (:func:`dp_accounting.calibrate_dp_mechanism`, Brent's
    method within :data:`CALIBRATION_TOL`; then raised by that tolerance until :func:`epsilon`
    is at most the target, so rounding never spends more than the target)."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: RdpAccountant(ORDERS), lambda s: _event(q, s, steps), target_epsilon, delta,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=CALIBRATION_TOL))
    while epsilon(q, sigma, steps, delta) > target_epsilon:
        sigma += CALIBRATION_TOL
    return sigma


def noise_multiplier(config: PVIConfig, num_examples: int, num_clients: int) -> float:
    """``sigma`` of a client with ``num_examples`` rows: ``dp-noise-multiplier`` as set, or
    calibrated to ``dp-epsilon`` over the planned run."""
    if config.dp_noise_multiplier > 0:
        return float(config.dp_noise_multiplier)
    q = sampling_rate(config.batch_size, num_examples)
    return calibrate(q, planned_steps(config, num_clients), float(config.dp_epsilon),
                     float(config.dp_delta))


def spent(config: PVIConfig, num_examples: int, num_clients: int, participations: int) -> float:
    """Epsilon (at ``dp-delta``) a client with ``num_examples`` rows has spent after
    ``participations`` rounds of ``local-steps`` DP-SGD steps."""
    q = sampling_rate(config.batch_size, num_examples)
    sigma = noise_multiplier(config, num_examples, num_clients)
    return epsilon(q, sigma, int(participations) * config.local_steps, float(config.dp_delta))


def worst_spent(config: PVIConfig, examples, participations, num_clients: int) -> float:
    """The largest epsilon spent over the clients whose data size the server knows (``examples
    > 0``; a client whose replies never arrived has not told it)."""
    values = [spent(config, int(n), num_clients, int(p))
              for n, p in zip(examples, participations, strict=True) if n > 0 and p > 0]
    return max(values, default=0.0)


def over_target(config: PVIConfig, examples, participations, pids, num_clients: int):
    """``(partition, epsilon)`` of the first client in ``pids`` whose next round would take it
    past ``dp-epsilon`` (None when none would, or no target is set)."""
    target = float(config.dp_epsilon)
    if target <= 0:
        return None
    for pid in pids:
        n = int(examples[pid])
        if n > 0:
            after = spent(config, n, num_clients, int(participations[pid]) + 1)
            if after > target and not math.isclose(after, target, rel_tol=1e-12):
                return pid, after
    return None
