"""Mean-field exponential-family models with label symmetry: ``gmm``, ``lda``, ``latent-feature``.

These are not likelihoods over one parameter vector: their posteriors are NamedTuples of
:mod:`fedbayes_flwr.inference.expfam` blocks fitted by coordinate ascent
(:mod:`fedbayes_flwr.inference.vb`), and
only the AMPS family (``amps``, ``naive-merge``, ``batch-vb``, ``local-only``) runs them. The
classes here are the registry's view of them: the CLI name, the data they need, their test
metrics, and :meth:`StructuredModel.vb`, which builds the :class:`~fedbayes_flwr.inference.vb.VBModel`
from the run's settings:

* ``K`` = ``amps.components``; ``D`` = the data's columns (``lda``: the vocabulary);
* ``gmm``: ``sigma^2 = noise-scale^2`` (the paper: 0.3^2 = 0.09), means' prior
  ``N(0, prior-scale^2 I)`` (the paper: prior-scale = sqrt 2), weights ``Dirichlet(amps.concentration)``;
* ``lda``: ``alpha = amps.doc-concentration`` (0 = ``1 / K``), ``eta = amps.topic-concentration``;
* ``latent-feature``: ``sigma^2 = noise-scale^2`` (the paper: 0.2^2 = 0.04), ``Beta(c, c)``
  inclusion probabilities with ``c = amps.concentration`` (the paper: 1), features' prior
  precision ``nu0`` estimated once from the clients' data moments and shared.

``prior()`` gives the one-dimensional Gaussian stand-in the generic experiment code carries
(``N(0, prior-scale^2)``, which is how :meth:`vb` reads ``prior-scale``).

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Sections 3.1-3.3.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.vb.gmm import GMM
from fedbayes_flwr.inference.vb.latent_feature import LatentFeature
from fedbayes_flwr.inference.vb.lda import LDA


class StructuredModel:
    """A structured model's registry entry (module docstring)."""

    name = ""
    structured = True
    target = "none"
    synthetic = "gaussian-mean"
    has_targets = False
    task = "structured"
    conjugate = False
    deterministic_expectations = False
    mean_field_only = True
    gaussian_prior = True
    support = None
    needs_moments = False

    def __init__(self, noise_scale: float = 1.0):
        if not noise_scale > 0:
            raise ValueError(f"noise-scale must be > 0, got {noise_scale}")
        self.noise_scale = float(noise_scale)

    @classmethod
    def build(cls, noise_scale: float = 1.0, hidden=(50,), num_outputs: int = 1):
        return cls(noise_scale)

    def param_dim(self, num_features: int) -> int:
        return 1

    def prior(self, num_features: int, prior_scale: float, diag: bool) -> NaturalGaussian:
        """The stand-in ``N(0, prior_scale^2)`` (dimension 1): it carries ``prior-scale``."""
        if not prior_scale > 0:
            raise ValueError(f"prior-scale must be > 0, got {prior_scale}")
        return G.from_moments(np.zeros(1), np.full(1, float(prior_scale) ** 2))

    def vb(self, config, num_features: int, stand_in: NaturalGaussian, prior_precision=None):
        """The :class:`~fedbayes_flwr.inference.vb.VBModel` for the run (``config``: the AMPS section)."""
        raise NotImplementedError

    def check_data(self, x: np.ndarray) -> str | None:
        """Why these rows cannot be this model's data (None if they can)."""
        return None

    def metrics(self, posterior, x, y) -> tuple[dict, None]:
        """Held-out log-likelihood per predicted unit (the model's own protocol)."""
        return {"heldout_loglik": float(posterior.vb.heldout_loglik(posterior.params, x))}, None


def _prior_var(stand_in: NaturalGaussian) -> float:
    return float(1.0 / G.precision(stand_in).ravel()[0])


class GMMModel(StructuredModel):
    """``gmm``: Gaussian mixture with known variance (:class:`fedbayes_flwr.inference.vb.gmm.GMM`)."""

    name = "gmm"

    def vb(self, config, num_features, stand_in, prior_precision=None):
        return GMM(config.components, num_features, self.noise_scale**2, _prior_var(stand_in),
                   config.concentration)


class LDAModel(StructuredModel):
    """``lda``: latent Dirichlet allocation on word counts (:class:`fedbayes_flwr.inference.vb.lda.LDA`)."""

    name = "lda"

    def vb(self, config, num_features, stand_in, prior_precision=None):
        return LDA(config.components, num_features, config.doc_concentration or None,
                   config.topic_concentration)

    def check_data(self, x):
        x = np.asarray(x)
        if x.size and (float(x.min()) < 0 or not np.allclose(x, np.round(x))):
            return ("lda needs word counts (non-negative integers per document and word), e.g. "
                    "dataset lda-corpus")
        return None


class LatentFeatureModel(StructuredModel):
    """``latent-feature``: the finite latent feature model
    (:class:`fedbayes_flwr.inference.vb.latent_feature.LatentFeature`)."""

    name = "latent-feature"
    needs_moments = True

    def vb(self, config, num_features, stand_in, prior_precision=None):
        return LatentFeature(config.components, num_features, self.noise_scale**2,
                             config.concentration, config.concentration,
                             1.0 if prior_precision is None else float(prior_precision))


STRUCTURED_CLASSES = (GMMModel, LDAModel, LatentFeatureModel)
