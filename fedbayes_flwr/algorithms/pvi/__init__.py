"""Partitioned variational inference (PVI) and its baselines.

``config`` (:class:`PVIConfig`, the ``[tool.flwr.app.config.pvi]`` section), ``messages`` (states
and messages), ``client`` (the local step, the free-energy terms), ``server`` (the damped update
and the step search over candidate steps), ``step`` (step control: Anderson, the non-monotone
window), ``tempered`` (the proximal local problem), ``presets`` (the baselines' named settings),
``bundle`` (the bundle and its registrations), ``privacy`` (DP-PVI's accountant: sampling rate,
noise calibration, epsilon spent, through ``dp-accounting``). The local Gaussian VI solver is shared:
:mod:`fedbayes_flwr.inference.vi`.

The public names are re-exported here: ``from fedbayes_flwr.algorithms.pvi import PVIConfig``.
"""

from fedbayes_flwr.algorithms.pvi.bundle import BUNDLE, registrations
from fedbayes_flwr.algorithms.pvi.config import PVIConfig

__all__ = ["BUNDLE", "PVIConfig", "registrations"]
