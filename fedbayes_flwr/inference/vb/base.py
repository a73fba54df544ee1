"""The contract of a mean-field exponential-family model (:class:`VBModel`) and its fit result.

A model's global posterior is a NamedTuple of :mod:`fedbayes_flwr.inference.expfam` blocks (``params``).
Blocks named in :attr:`VBModel.symmetric` have coupled label symmetry: the likelihood is
unchanged when their components (axis 0) are permuted together, so AMPS aligns them; other blocks
are merged naively. Local variables (responsibilities, document-topic proportions, feature
assignments) never leave :meth:`VBModel.fit`.

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3 (coupled
permutation symmetry); Blei, Kucukelbir & McAuliffe (2017), "Variational Inference: A Review for
Statisticians", Section 2.4 (coordinate ascent).
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import numpy as np


class FitResult(NamedTuple):
    """A local fit: the best restart's posterior and ELBO.

    Attributes
    ----------
    params : NamedTuple
        The posterior's blocks (prior included: ``params - prior`` is the data's contribution).
    elbo : float
        Evidence lower bound of the best restart (nats).
    iterations : int
        Coordinate-ascent sweeps of the best restart.
    converged : bool
        Whether the best restart met the ELBO tolerance within ``max_iter`` sweeps.
    elbos : tuple of float
        Final ELBO of every restart, in order.
    """

    params: Any
    elbo: float
    iterations: int
    converged: bool
    elbos: tuple = ()


class VBModel(abc.ABC):
    """A mean-field exponential-family model with closed-form coordinate ascent.

    Attributes
    ----------
    name : str
        The model's registry name (``gmm``, ``lda``, ``latent-feature``).
    symmetric : tuple of str
        Fields of ``params`` permuted together along axis 0 (coupled label symmetry).
    num_components : int
        ``K``: mixture components, topics or latent features.
    """

    name = ""
    symmetric: tuple[str, ...] = ()
    num_components = 1

    @abc.abstractmethod
    def prior(self) -> Any:
        """The prior's blocks (the same structure as every posterior)."""

    @abc.abstractmethod
    def fit(self, x: np.ndarray, prior: Any, rng: np.random.Generator, *, restarts: int = 1,
            tol: float = 1e-6, max_iter: int = 500) -> FitResult:
        """Coordinate ascent from ``restarts`` random symmetry-breaking starts; keep the best ELBO.

        Stops a restart when the ELBO's relative change ``|dL| / |L|`` falls below ``tol``.
        ``prior`` may be any valid posterior of the model (streaming: a merged posterior).
        """

    @abc.abstractmethod
    def heldout_loglik(self, params: Any, x_test: np.ndarray, seed: int = 0) -> float:
        """Held-out log-likelihood per predicted unit (point, word, coordinate) under ``params``."""

    @abc.abstractmethod
    def component_means(self, params: Any) -> np.ndarray:
        """``(K, D)`` posterior means of the symmetric components (means, topics, features)."""
