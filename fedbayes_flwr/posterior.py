"""One posterior interface for every algorithm: sample, mean, std, predictive, save.

:class:`GaussianPosterior` wraps a proper :class:`~fedbayes_flwr.gaussian.NaturalGaussian` (PVI,
global VI, Gaussian merging). :class:`SamplePosterior` wraps particles or MCMC draws. Metrics take a
posterior and a model only (:meth:`fedbayes_flwr.models.Model.metrics`), so every algorithm is
compared on the same footing.
"""

from __future__ import annotations

import os

import numpy as np

from . import gaussian as G
from .gaussian import NaturalGaussian


class GaussianPosterior:
    """A Gaussian posterior held in natural parameters."""

    kind = "gaussian"

    def __init__(self, natural: NaturalGaussian):
        G.check_proper(natural, "posterior")
        self.natural = natural
        self._mean, self._cov = G.to_moments(natural)

    @property
    def dim(self) -> int:
        return self.natural.dim

    def mean(self) -> np.ndarray:
        return self._mean

    def cov(self) -> np.ndarray:
        """Full ``(d, d)`` covariance (diagonal posteriors give a diagonal matrix)."""
        return np.diag(self._cov) if self.natural.is_diag else self._cov

    def std(self) -> np.ndarray:
        return np.sqrt(np.diag(self.cov()))

    def sample(self, seed: np.ndarray, n: int) -> np.ndarray:
        """``n`` draws, shape ``(n, d)``, from a stateless ``int32[2]`` seed (TFP)."""
        dist = G.to_tfp(self.natural)
        return dist.sample(n, seed=np.asarray(seed, dtype=np.int32)).numpy()

    def save(self, path: str | os.PathLike) -> None:
        """Write ``mean``, ``std``, ``cov`` and the natural parameters to an ``.npz`` file."""
        _atomic_savez(path, mean=self.mean(), std=self.std(), cov=self.cov(),
                      eta1=self.natural.eta1, eta2=self.natural.eta2)


class SamplePosterior:
    """A posterior represented by draws or particles, shape ``(n, d)``."""

    kind = "samples"

    def __init__(self, samples):
        samples = np.asarray(samples, dtype=np.float64)
        if samples.ndim != 2 or samples.shape[0] < 1:
            raise ValueError(f"samples must have shape (n, d), got {samples.shape}")
        self.samples = samples

    @property
    def dim(self) -> int:
        return int(self.samples.shape[1])

    def mean(self) -> np.ndarray:
        return self.samples.mean(axis=0)

    def std(self) -> np.ndarray:
        return self.samples.std(axis=0)

    def sample(self, seed: np.ndarray, n: int) -> np.ndarray:
        rng = np.random.default_rng(np.asarray(seed, dtype=np.int64) & 0xFFFFFFFF)
        return self.samples[rng.integers(0, self.samples.shape[0], size=n)]

    def save(self, path: str | os.PathLike) -> None:
        _atomic_savez(path, mean=self.mean(), std=self.std(), samples=self.samples)


def _atomic_savez(path, **arrays) -> None:
    path = os.fspath(path)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
