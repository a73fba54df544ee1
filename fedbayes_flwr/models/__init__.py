"""Models as log-likelihoods over a parameter vector ``theta``.

* :mod:`.base`: the :class:`Model` base class (log prior, compiled batched log density and
  gradient, per-datum gradients, metrics) and :class:`Prediction`;
* :mod:`.linear`: ``gaussian-mean``, ``linear-regression``, ``logistic-regression``;
* :mod:`.bnn`: ``bnn-classifier``, ``bnn-regression`` and :func:`parse_hidden`;
* :mod:`.registry`: :data:`MODELS`, :func:`make_model`, :func:`model_class`,
  :func:`exact_posterior`.
"""

from .base import (
    FREE_ENERGY_SAMPLES,
    FREE_ENERGY_SEED,
    SYNTHETIC,
    TARGETS,
    Model,
    Prediction,
)
from .bnn import BNN, INIT_SEED, INIT_STD, BNNClassifier, BNNRegression, parse_hidden
from .linear import GaussianMean, LinearRegression, LogisticRegression
from .registry import MODELS, exact_posterior, make_model, model_class

__all__ = [
    "BNN",
    "FREE_ENERGY_SAMPLES",
    "FREE_ENERGY_SEED",
    "INIT_SEED",
    "INIT_STD",
    "MODELS",
    "SYNTHETIC",
    "TARGETS",
    "BNNClassifier",
    "BNNRegression",
    "GaussianMean",
    "LinearRegression",
    "LogisticRegression",
    "Model",
    "Prediction",
    "exact_posterior",
    "make_model",
    "model_class",
    "parse_hidden",
]
