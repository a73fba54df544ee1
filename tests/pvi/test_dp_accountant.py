"""DP-PVI's accountant (:mod:`fedbayes_flwr.algorithms.pvi.privacy`): the epsilon is
``dp-accounting``'s and reproduces a published value; calibration never exceeds its target."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from fedbayes_flwr.algorithms.pvi import privacy
from fedbayes_flwr.algorithms.pvi.config import PVIConfig


def _library_epsilon(q, sigma, steps, delta):
    accountant = RdpAccountant(privacy.ORDERS)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                       steps)
    return accountant


@pytest.mark.parametrize("q, sigma, steps, delta", [(0.01, 4.0, 10_000, 1e-5),
                                                     (256 / 60_000, 1.1, 14_063, 1e-5),
                                                     (0.2, 2.5, 300, 1e-5), (1.0, 30.0, 40, 1e-6)])
def test_epsilon_is_the_libraries(q, sigma, steps, delta):
    """Same events, same orders: the same number, exactly (nothing is recomputed here)."""
    assert privacy.epsilon(q, sigma, steps, delta) == _library_epsilon(q, sigma, steps,
                                                                       delta).get_epsilon(delta)


def test_abadi_et_al_2016_setting_reproduces_its_published_epsilon():
    """Abadi et al. (2016), "Deep Learning with Differential Privacy", CCS, Section 3.1 (after
    Theorem 1): with q = 0.01, sigma = 4, delta = 1e-5 and T = 10,000 steps, "we have epsilon
    ~= 1.26 using the moments accountant". Their conversion is the moments bound
    ``epsilon = min_lambda (alpha(lambda) + log(1/delta)) / lambda`` with ``alpha(lambda) =
    lambda * RDP(lambda + 1)``, i.e. ``min_a RDP(a) + log(1/delta) / (a - 1)`` over the Renyi
    orders ``a``: applied to the library's RDP curve of the same events it gives 1.26 to the two
    decimals published (|error| <= 0.005). The accountant itself reports epsilon by the
    library's tighter conversion (Balle et al. 2020), so it must be at most that value."""
    delta = 1e-5
    accountant = _library_epsilon(0.01, 4.0, 10_000, delta)
    orders, rdp = np.asarray(accountant._orders, float), np.asarray(accountant._rdp, float)
    moments_bound = float(np.min(rdp + math.log(1 / delta) / (orders - 1)))
    assert abs(moments_bound - 1.26) <= 0.005, moments_bound
    ours = privacy.epsilon(0.01, 4.0, 10_000, delta)
    assert ours <= moments_bound
    assert ours > 0.5 * moments_bound  # not a vacuous accountant


@pytest.mark.parametrize("q, steps, target", [(0.05, 200, 1.0), (0.3, 60, 0.5), (1.0, 20, 8.0),
                                              (0.01, 5_000, 2.0)])
def test_calibration_never_exceeds_its_target_and_is_tight(q, steps, target):
    delta = 1e-5
    sigma = privacy.calibrate(q, steps, target, delta)
    spent = privacy.epsilon(q, sigma, steps, delta)
    assert spent <= target
    # Brent's tolerance is 1e-5 in sigma: a sigma 0.1% smaller must overshoot (tight)
    assert privacy.epsilon(q, sigma * (1 - 1e-3), steps, delta) > target
    assert privacy.epsilon(q, sigma, steps + max(1, steps // 10), delta) > spent  # composition


def test_planned_steps_follow_the_schedule():
    sync = PVIConfig(dp="dp-sgd", damping=0.5, dp_epsilon=1.0, dp_delta=1e-5, dp_rounds=7,
                     local_steps=30)
    assert privacy.planned_steps(sync, num_clients=3) == 7 * 30
    seq = PVIConfig(schedule="sequential", dp="dp-sgd", damping=0.5, dp_epsilon=1.0,
                    dp_delta=1e-5, dp_rounds=7, local_steps=30)
    assert privacy.planned_steps(seq, num_clients=3) == 3 * 30  # ceil(7 / 3) visits
    assert privacy.sampling_rate(0, 40) == 1.0 and privacy.sampling_rate(10, 40) == 0.25


def test_spent_is_monotone_and_the_worst_client_is_reported():
    config = PVIConfig(dp="dp-sgd", damping=0.5, dp_noise_multiplier=1.5, dp_delta=1e-5,
                       dp_rounds=5, batch_size=5, local_steps=10)
    small, large = privacy.spent(config, 10, 2, 3), privacy.spent(config, 100, 2, 3)
    assert small > large  # a larger sampling rate spends more
    assert privacy.spent(config, 10, 2, 4) > small
    assert privacy.worst_spent(config, [10, 100], [3, 3], 2) == small
    assert privacy.worst_spent(config, [0, 100], [3, 3], 2) == large  # size unknown: left out
    target = PVIConfig(**{**config.__dict__, "dp_epsilon": small})
    assert privacy.over_target(target, [10, 100], [2, 2], [0, 1], 2) is None  # 3rd round: = target
    assert privacy.over_target(target, [10, 100], [3, 3], [0, 1], 2)[0] == 0
