"""The model registry: one line per model class.

Adding a model = one :class:`~fedbayes_flwr.models.base.Model` subclass (with ``name``, ``target``,
``synthetic``, ``deterministic_expectations``, ``log_likelihood_rows_tf`` and ``predictive``) and
one entry in ``_CLASSES``; :data:`MODELS`, the CLI choices and the parametrised model tests follow.
"""

from __future__ import annotations

import functools

from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.models.ar1 import AR1StudentT
from fedbayes_flwr.models.base import Model
from fedbayes_flwr.models.bnn import BNNClassifier, BNNRegression
from fedbayes_flwr.models.linear import (
    GaussianMean,
    LinearRegression,
    LogisticHyperprior,
    LogisticRegression,
)
from fedbayes_flwr.models.mixture import MixtureLikelihood1D
from fedbayes_flwr.models.structured import STRUCTURED_CLASSES

_CLASSES: dict[str, type[Model]] = {
    cls.name: cls
    for cls in (GaussianMean, LinearRegression, LogisticRegression, BNNClassifier, BNNRegression,
                LogisticHyperprior, MixtureLikelihood1D, AR1StudentT)
}
MODELS: tuple[str, ...] = tuple(_CLASSES)
"""The models over one parameter vector (every family runs them)."""
_STRUCTURED = {cls.name: cls for cls in STRUCTURED_CLASSES}
STRUCTURED_MODELS: tuple[str, ...] = tuple(_STRUCTURED)
"""Mean-field exponential-family models with label symmetry (the AMPS family only)."""
ALL_MODELS: tuple[str, ...] = MODELS + STRUCTURED_MODELS


def model_class(name: str) -> type[Model]:
    """The class registered as ``name`` (see :data:`MODELS`), without building it."""
    try:
        return _CLASSES[name] if name in _CLASSES else _STRUCTURED[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(ALL_MODELS)}") from None


@functools.cache
def make_model(name: str, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
               num_outputs: int = 1) -> Model:
    """The model called ``name`` (see :data:`MODELS`); one shared instance per arguments, so the
    compiled local optimiser and log density are traced once per model, not once per call.

    ``hidden`` (hidden-layer widths) and ``num_outputs`` (classes) apply to the BNN models only.
    """
    return model_class(name).build(noise_scale, tuple(hidden), num_outputs)


def exact_posterior(model: Model, prior: NaturalGaussian, x, y) -> NaturalGaussian:
    """Exact posterior of a conjugate model on the pooled data (full covariance)."""
    factor = model.likelihood_factor(x, y)
    if factor is None:
        raise ValueError(f"model {model.name!r} has no closed-form posterior")
    return G.add(G.like(factor, prior), factor)
