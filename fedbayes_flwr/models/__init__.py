"""Models as log-likelihoods over a parameter vector ``theta``.

* :mod:`.base`: the :class:`Model` base class (log prior, compiled batched log density and
  gradient, per-datum gradients, metrics) and :class:`Prediction`;
* :mod:`.linear`: ``gaussian-mean``, ``linear-regression``, ``logistic-regression``,
  ``logistic-hyperprior``;
* :mod:`.mixture`: ``mixture-1d``, the 1-D Gaussian-mixture toy of DSVGD;
* :mod:`.ar1`: ``ar1-student-t``, the AR(1) model with Student-t noise of Fed-PDMC;
* :mod:`.structured`: ``gmm``, ``lda``, ``latent-feature`` (mean-field exponential-family
  models for the AMPS family, :data:`STRUCTURED_MODELS`);
* :mod:`.bnn`: ``bnn-classifier``, ``bnn-regression`` and :func:`parse_hidden`;
* :mod:`.likelihood`: :class:`LikelihoodModel`, a model written as one TensorFlow
  log-likelihood (every derived quantity by autodiff);
* :mod:`.keras_net`: :class:`KerasModel`, a user's Keras 3 network over the flat vector of its
  trainable weights (Keras is imported when one is built, not with this package);
* :mod:`.registry`: :func:`model_names` (``MODELS``, ``ALL_MODELS``), :func:`make_model`,
  :func:`model_spec`,
  :func:`register_model`, :func:`load_model_modules`, :func:`exact_posterior`.

``MODELS`` and ``ALL_MODELS`` are read from the registry at each access (``models.MODELS``), so
they include the models registered by plugins since (``from ... import MODELS`` binds the value
of that moment).
"""

from fedbayes_flwr.models import registry as _registry
from fedbayes_flwr.models.ar1 import AR1StudentT
from fedbayes_flwr.models.base import (
    FREE_ENERGY_SAMPLES,
    FREE_ENERGY_SEED,
    SYNTHETIC,
    TARGETS,
    Model,
    Prediction,
)
from fedbayes_flwr.models.bnn import BNN, INIT_SEED, INIT_STD, BNNClassifier, BNNRegression, parse_hidden
from fedbayes_flwr.models.keras_net import KerasModel
from fedbayes_flwr.models.likelihood import LikelihoodModel
from fedbayes_flwr.models.linear import (
    GaussianMean,
    LinearRegression,
    LogisticHyperprior,
    LogisticRegression,
)
from fedbayes_flwr.models.mixture import MixtureLikelihood1D
from fedbayes_flwr.models.registry import (
    STRUCTURED_MODELS,
    describe_model,
    exact_posterior,
    load_model_modules,
    make_model,
    model_names,
    model_spec,
    register_model,
    register_object,
    stable_name,
)


def __getattr__(name: str) -> tuple[str, ...]:
    """``MODELS`` / ``ALL_MODELS``: the registry's current tuples (plugins included)."""
    if name in ("MODELS", "ALL_MODELS"):
        return getattr(_registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALL_MODELS",
    "BNN",
    "FREE_ENERGY_SAMPLES",
    "FREE_ENERGY_SEED",
    "INIT_SEED",
    "INIT_STD",
    "MODELS",
    "STRUCTURED_MODELS",
    "SYNTHETIC",
    "TARGETS",
    "AR1StudentT",
    "BNNClassifier",
    "BNNRegression",
    "GaussianMean",
    "KerasModel",
    "LikelihoodModel",
    "LinearRegression",
    "LogisticHyperprior",
    "LogisticRegression",
    "MixtureLikelihood1D",
    "Model",
    "Prediction",
    "exact_posterior",
    "load_model_modules",
    "make_model",
    "describe_model",
    "model_names",
    "model_spec",
    "parse_hidden",
    "register_model",
    "register_object",
    "stable_name",
]
