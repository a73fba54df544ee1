"""One posterior interface for every algorithm: sample, mean, std, predictive, save.

:class:`Posterior` is the protocol (an abstract base class). A concrete posterior implements
:meth:`~Posterior.sample`, :meth:`~Posterior.mean`, :meth:`~Posterior.std`, :meth:`~Posterior.save`
and :attr:`~Posterior.dim`; the rest has defaults built on those five:

* :meth:`~Posterior.draws`: fixed-seed draws for predictive use (``PREDICTIVE_SEED``,
  ``PREDICTIVE_SAMPLES``), so every engine reports the same metrics for the same posterior;
* :meth:`~Posterior.linear_moments`: mean and variance of ``features @ theta`` (Monte Carlo from
  :meth:`~Posterior.draws` by default; exact for :class:`GaussianPosterior`);
* :meth:`~Posterior.diagnostics`: a dict of sampler diagnostics (empty by default);
* :attr:`~Posterior.gaussian`: whether the posterior is exactly Gaussian, so that a model may use a
  quadrature on the Gaussian activation instead of averaging over draws.

:func:`load_posterior` reads back what :meth:`~Posterior.save` wrote.

:class:`GaussianPosterior` wraps a proper :class:`~fedbayes_flwr.inference.gaussian.NaturalGaussian` (PVI,
global VI, Gaussian merging). :class:`SamplePosterior` wraps particles or MCMC draws, keeping the
chain structure for ESS and R-hat. Models compute predictives and metrics from this interface only
(:meth:`fedbayes_flwr.models.Model.metrics`), so every algorithm is compared on the same footing.
"""

from __future__ import annotations

import abc
import os

import numpy as np

from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian

__all__ = ["PREDICTIVE_SAMPLES", "PREDICTIVE_SEED", "GaussianPosterior", "Posterior",
           "SamplePosterior", "TracePosterior", "StructuredPosterior", "load_posterior"]

PREDICTIVE_SAMPLES = 100
PREDICTIVE_SEED = np.array([20240, 7], dtype=np.int32)


class Posterior(abc.ABC):
    """The posterior protocol shared by every algorithm family.

    Subclasses implement :meth:`sample`, :meth:`mean`, :meth:`std`, :meth:`save` and :attr:`dim`.
    """

    kind = "posterior"
    gaussian = False
    """``True`` when the posterior is exactly Gaussian (then :meth:`linear_moments` describes the
    whole distribution of ``features @ theta``, not just its first two moments)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Number of parameters ``d``."""

    @abc.abstractmethod
    def sample(self, seed: np.ndarray, n: int) -> np.ndarray:
        """``n`` draws, shape ``(n, d)``, from a stateless ``int32[2]`` seed."""

    @abc.abstractmethod
    def mean(self) -> np.ndarray:
        """Posterior mean, shape ``(d,)``."""

    @abc.abstractmethod
    def std(self) -> np.ndarray:
        """Marginal posterior standard deviations, shape ``(d,)``."""

    @abc.abstractmethod
    def save(self, path: str | os.PathLike) -> None:
        """Write the posterior to an ``.npz`` file (at least ``mean`` and ``std``)."""

    def draws(self, n: int | None = None) -> np.ndarray:
        """Fixed-seed draws for predictive use, shape ``(n, d)``.

        Parameters
        ----------
        n : int, optional
            Number of draws; ``None`` gives the posterior's default predictive set
            (``PREDICTIVE_SAMPLES`` draws from ``PREDICTIVE_SEED`` here).
        """
        return self.sample(PREDICTIVE_SEED, PREDICTIVE_SAMPLES if n is None else int(n))

    def linear_moments(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of each activation ``features @ theta``.

        Parameters
        ----------
        features : numpy.ndarray
            ``(m, d)`` design matrix.

        Returns
        -------
        mean, var : numpy.ndarray
            Both of shape ``(m,)``. By default the Monte-Carlo moments over :meth:`draws`
            (variance with ``ddof=0``).
        """
        f = self.draws() @ np.asarray(features, dtype=np.float64).T
        return f.mean(axis=0), f.var(axis=0)

    def diagnostics(self) -> dict[str, float]:
        """Sampler diagnostics as plain floats (none by default)."""
        return {}


class GaussianPosterior(Posterior):
    """A Gaussian posterior held in natural parameters (diagonal or full covariance)."""

    kind = "gaussian"
    gaussian = True

    def __init__(self, natural: NaturalGaussian):
        G.check_proper(natural, "posterior")
        self.natural = natural
        self._mean, self._cov = G.to_moments(natural)  # _cov is a variance vector if diagonal

    @property
    def dim(self) -> int:
        return self.natural.dim

    def mean(self) -> np.ndarray:
        return self._mean

    def cov(self) -> np.ndarray:
        """Full ``(d, d)`` covariance of a full-covariance posterior.

        A mean-field posterior never materialises a ``d x d`` matrix (a 40k-parameter BNN would
        need 12.7 GB): it raises; use :meth:`var`, :meth:`std` or :meth:`linear_moments`.
        """
        if self.natural.is_diag:
            raise ValueError("a mean-field posterior has no dense covariance; use var() or std()")
        return self._cov

    def var(self) -> np.ndarray:
        """Marginal variances, shape ``(d,)``, without building a dense matrix."""
        return self._cov if self.natural.is_diag else np.diag(self._cov).copy()

    def std(self) -> np.ndarray:
        return np.sqrt(self.var())

    def linear_moments(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact mean ``F m`` and variance ``diag(F S F^T)`` of ``F @ theta``.

        A diagonal posterior uses ``(F ** 2) @ var`` (``O(m d)`` time and memory, no ``d x d``).
        """
        features = np.asarray(features, dtype=np.float64)
        mean = features @ self._mean
        if self.natural.is_diag:
            return mean, features**2 @ self._cov
        return mean, np.einsum("ij,jk,ik->i", features, self._cov, features)

    def sample(self, seed: np.ndarray, n: int) -> np.ndarray:
        """``n`` draws, shape ``(n, d)``, from a stateless ``int32[2]`` seed (TFP)."""
        dist = G.to_tfp(self.natural)
        return dist.sample(n, seed=np.asarray(seed, dtype=np.int32)).numpy()

    def save(self, path: str | os.PathLike) -> None:
        """Write ``mean``, ``std``, the natural parameters and ``cov`` (full covariance) or
        ``var`` (mean-field: O(d) on disk) to an ``.npz`` file."""
        second = {"var": self.var()} if self.natural.is_diag else {"cov": self._cov}
        _atomic_savez(path, mean=self.mean(), std=self.std(), eta1=self.natural.eta1,
                      eta2=self.natural.eta2, **second)


class SamplePosterior(Posterior):
    """A posterior represented by draws or particles.

    Parameters
    ----------
    samples : array_like
        ``(n, d)`` draws (one chain, or particles) or ``(chains, draws, d)`` MCMC output. The
        chain structure is kept in :attr:`chains` (``(C, N, d)``); :attr:`samples` is the flat
        ``(C * N, d)`` view used for moments and predictions. Draws are assumed to be in chain
        order for :meth:`ess` and :meth:`rhat`.

    References
    ----------
    Geyer (1992), "Practical Markov chain Monte Carlo" (initial positive sequence ESS);
    Gelman & Rubin (1992), "Inference from iterative simulation using multiple sequences" (R-hat);
    both as implemented by ``tfp.mcmc.effective_sample_size`` and
    ``tfp.mcmc.potential_scale_reduction``.
    """

    kind = "samples"

    def __init__(self, samples):
        samples = np.asarray(samples, dtype=np.float64)
        if samples.ndim == 2:
            samples = samples[None]
        if samples.ndim != 3 or samples.shape[0] < 1 or samples.shape[1] < 1:
            raise ValueError(f"samples must have shape (n, d) or (chains, draws, d), got "
                             f"{samples.shape}")
        self.chains = samples
        self.samples = samples.reshape(-1, samples.shape[2])

    @property
    def dim(self) -> int:
        return int(self.samples.shape[1])

    @property
    def num_chains(self) -> int:
        return int(self.chains.shape[0])

    def mean(self) -> np.ndarray:
        return self.samples.mean(axis=0)

    def std(self) -> np.ndarray:
        return self.samples.std(axis=0)

    def sample(self, seed: np.ndarray, n: int) -> np.ndarray:
        """``n`` draws resampled with replacement from the stored ones (seeded)."""
        rng = np.random.default_rng(np.asarray(seed, dtype=np.int64) & 0xFFFFFFFF)
        return self.samples[rng.integers(0, self.samples.shape[0], size=n)]

    def draws(self, n: int | None = None) -> np.ndarray:
        """All stored draws when ``n`` is ``None`` (no resampling noise), else ``n`` resampled."""
        return self.samples if n is None else super().draws(n)

    def ess(self) -> np.ndarray:
        """Effective sample size per dimension, shape ``(d,)``, summed over chains.

        Uses Geyer's initial positive sequence truncation; with two or more chains the
        cross-chain estimator (between-chain variance included), so disagreeing chains lower it.
        """
        import tensorflow as tf
        import tensorflow_probability as tfp

        states = np.transpose(self.chains, (1, 0, 2))  # (N, C, d)
        logger = tf.get_logger()
        level = logger.level
        logger.setLevel("ERROR")  # TFP's FFT autocorrelation casts complex -> real on purpose
        try:
            if self.num_chains > 1:
                ess = tfp.mcmc.effective_sample_size(states, filter_beyond_positive_pairs=True,
                                                     cross_chain_dims=1)
            else:
                ess = tfp.mcmc.effective_sample_size(states[:, 0],
                                                     filter_beyond_positive_pairs=True)
        finally:
            logger.setLevel(level)
        return np.asarray(ess, dtype=np.float64)

    def rhat(self) -> np.ndarray:
        """Potential scale reduction per dimension, shape ``(d,)``; NaN with fewer than 2 chains."""
        import tensorflow_probability as tfp

        if self.num_chains < 2:
            return np.full(self.dim, np.nan)
        states = np.transpose(self.chains, (1, 0, 2))  # (N, C, d)
        return np.asarray(tfp.mcmc.potential_scale_reduction(states, independent_chain_ndims=1),
                          dtype=np.float64)

    def diagnostics(self) -> dict[str, float]:
        """``{"ess_min", "ess_mean", "rhat_max"}`` as plain floats (``rhat_max`` NaN for 1 chain)."""
        ess, rhat = self.ess(), self.rhat()
        return {"ess_min": float(np.min(ess)), "ess_mean": float(np.mean(ess)),
                "rhat_max": float(np.max(rhat))}

    def save(self, path: str | os.PathLike) -> None:
        """Write ``mean``, ``std``, ``samples`` (flat) and ``chains`` to an ``.npz`` file."""
        _atomic_savez(path, mean=self.mean(), std=self.std(), samples=self.samples,
                      chains=self.chains)


class TracePosterior(SamplePosterior):
    """Draws of a sampler (chains kept apart) with what else its run produced.

    Parameters
    ----------
    samples : array_like
        ``(chains, draws, d)`` draws.
    extras : dict of numpy.ndarray
        Arrays saved next to the draws: a PDMP's skeleton (``skeleton_time``, ``skeleton_x``,
        ...), every agent's iterates of a decentralized sampler (``agent_samples``).
    counts : dict of float
        Work counters (``grad_evals``, ``events``, ``exchanges``); ESS per unit of each is added
        to :meth:`diagnostics`.
    """

    def __init__(self, samples, extras: dict, counts: dict):
        super().__init__(samples)
        self.extras, self.counts = extras, counts

    def diagnostics(self) -> dict[str, float]:
        if self.chains.shape[1] < 4:  # a warm-up record: too few draws for ESS / R-hat
            return {"draws_per_chain": float(self.chains.shape[1])}
        out = super().diagnostics()
        for key, value in self.counts.items():
            if value > 0:
                out[f"ess_per_{key.rstrip('s')}"] = out["ess_min"] / float(value)
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write ``mean``, ``std``, ``samples``, ``chains`` and the extra arrays."""
        _atomic_savez(path, mean=self.mean(), std=self.std(), samples=self.samples,
                      chains=self.chains, **self.extras)


def _atomic_savez(path, **arrays) -> None:
    path = os.fspath(path)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


class StructuredPosterior(Posterior):
    """A mean-field exponential-family posterior: a NamedTuple of :mod:`fedbayes_flwr.inference.expfam`
    blocks (AMPS's ``gmm``, ``lda``, ``latent-feature``).

    The flat parameter vector ``theta`` of the common interface is the concatenation of the
    blocks' variables in field order, each flattened row-major: mixture means then weights,
    topic-word probabilities, feature vectors then inclusion probabilities. :meth:`mean`,
    :meth:`std` and :meth:`sample` follow it; the predictive is the model's own
    (``vb.heldout_loglik``).

    Parameters
    ----------
    params : NamedTuple
        The blocks.
    vb : fedbayes_flwr.inference.vb.VBModel
        The model that fitted them (its predictive and its symmetric blocks).
    """

    kind = "structured"

    def __init__(self, params, vb):
        for name, block in expfam.blocks(params).items():
            reason = expfam.domain_error(block, name)
            if reason:
                raise ValueError(f"posterior: {reason}")
        self.params, self.vb = params, vb

    def _flat(self, fn) -> np.ndarray:
        return np.concatenate([np.ravel(fn(block)) for block in expfam.blocks(self.params).values()])

    @property
    def dim(self) -> int:
        return int(self.mean().shape[0])

    def mean(self) -> np.ndarray:
        return self._flat(expfam.mean)

    def std(self) -> np.ndarray:
        return self._flat(expfam.std)

    def sample(self, seed: np.ndarray, n: int) -> np.ndarray:
        """``n`` draws ``(n, d)`` of the flat vector (blocks independent), from a stateless seed."""
        rng = np.random.default_rng(np.asarray(seed, dtype=np.int64) & 0xFFFFFFFF)
        return np.concatenate([expfam.sample(block, rng, n).reshape(n, -1)
                               for block in expfam.blocks(self.params).values()], axis=1)

    def save(self, path: str | os.PathLike) -> None:
        """Write ``mean``, ``std`` and every block array as ``<field>.<array>`` (e.g.
        ``means.h``, ``weights.alpha``) to an ``.npz`` file."""
        arrays = {f"{name}.{field}": np.asarray(value)
                  for name, block in expfam.blocks(self.params).items()
                  for field, value in zip(block._fields, block, strict=True)}
        _atomic_savez(path, mean=self.mean(), std=self.std(), **arrays)


_MOMENT_KEYS = ("mean", "std")
_SAMPLE_KEYS = ("mean", "std", "samples", "chains")


def load_posterior(path: str | os.PathLike,
                   template: StructuredPosterior | None = None) -> Posterior:
    """Read back a posterior written by :meth:`Posterior.save` (a run's ``posterior.npz``).

    The kind is told by the arrays the file holds: ``eta1``/``eta2`` give a
    :class:`GaussianPosterior`; ``chains`` a :class:`SamplePosterior`, or a
    :class:`TracePosterior` when other arrays (a skeleton, agents' iterates) are stored next to
    them; ``<field>.<array>`` blocks a :class:`StructuredPosterior`, rebuilt on ``template``.
    :meth:`~Posterior.mean` and :meth:`~Posterior.std` of the result are bitwise those of the
    posterior that was saved: they are recomputed from the same float64 arrays.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file.
    template : StructuredPosterior, optional
        A structured posterior of the same model (e.g. the bundle's posterior of its initial
        state): its NamedTuple structure and its ``vb`` model are reused. Needed for structured
        files only.

    Returns
    -------
    Posterior
        The restored posterior.

    Raises
    ------
    ValueError
        The file holds none of these layouts, or a structured file comes without ``template``.

    Notes
    -----
    A :class:`TracePosterior`'s work counters are not saved, so the restored one has none: its
    :meth:`~TracePosterior.diagnostics` lack the ``ess_per_*`` entries (``result.json``'s
    history keeps the diagnostics of every row).
    """
    with np.load(path, allow_pickle=False) as npz:
        arrays = {key: np.asarray(npz[key]) for key in npz.files}
    if "eta1" in arrays and "eta2" in arrays:
        return GaussianPosterior(G.make(arrays["eta1"], arrays["eta2"]))
    if "chains" in arrays:
        extras = {k: v for k, v in arrays.items() if k not in _SAMPLE_KEYS}
        if extras:
            return TracePosterior(arrays["chains"], extras=extras, counts={})
        return SamplePosterior(arrays["chains"])
    blocks = {k for k in arrays if k not in _MOMENT_KEYS}
    if blocks and all("." in k for k in blocks):
        if template is None:
            raise ValueError(f"{os.fspath(path)}: a structured posterior needs a template "
                             "(the model's own NamedTuple of blocks)")
        want = {f"{name}.{field}" for name, block in expfam.blocks(template.params).items()
                for field in block._fields}
        if want != blocks:
            raise ValueError(f"{os.fspath(path)}: its blocks ({', '.join(sorted(blocks))}) are "
                             f"not the template's ({', '.join(sorted(want))})")
        restored = {name: block._make(arrays[f"{name}.{field}"] for field in block._fields)
                    for name, block in expfam.blocks(template.params).items()}
        params = (restored[""] if "" in restored
                  else type(template.params)(**restored))
        return StructuredPosterior(params, template.vb)
    raise ValueError(f"{os.fspath(path)}: not a saved posterior (arrays: "
                     f"{', '.join(sorted(arrays)) or 'none'})")
