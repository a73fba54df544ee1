"""The model registry: one line per model class, plus the models that plugins register.

Adding a model = one :class:`~fedbayes_flwr.models.base.Model` subclass (with ``name``, ``target``,
``synthetic``, ``deterministic_expectations``, ``log_likelihood_rows_tf`` and ``predictive``) and
one entry in ``_CLASSES``; :data:`MODELS`, the CLI choices and the parametrised model tests follow.

Code outside the package adds a model with :func:`register_model` (a class, a built model such as
a :class:`~fedbayes_flwr.models.likelihood.LikelihoodModel`, or a factory), typically in a module
named in the ``model-modules`` run-config key, which the CLI, both Flower apps and a resumed run
import with :func:`load_model_modules` before they validate ``model``. :data:`MODELS` and
:data:`ALL_MODELS` are rebound on each registration: read them as ``registry.MODELS`` (or
``fedbayes_flwr.models.MODELS``) when the answer must include plugins registered later.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import re
import threading

import numpy as np

from fedbayes_flwr.errors import ConfigError
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


_SOURCES: dict[str, object] = {}
"""``{name: what register_model received}`` for the plugins' models (re-registration check)."""
_BUILT: dict[str, Model] = {}
"""The plugins' already-built models: :func:`make_model` returns them as they are."""
_LOCK = threading.RLock()

# The class attributes a model declares (module docstring of :mod:`fedbayes_flwr.models.base`).
_DECLARED = ("target", "synthetic", "deterministic_expectations", "conjugate", "has_targets",
             "task", "mean_field_only", "gaussian_prior", "support")


def _own_class(name: str, model: Model) -> type[Model]:
    """A subclass of ``type(model)`` declaring ``model``'s attributes at class level, so that
    :func:`model_class` answers for a model configured per instance (a
    :class:`~fedbayes_flwr.models.likelihood.LikelihoodModel`) as for a built-in class."""
    attrs: dict[str, object] = {k: getattr(model, k) for k in _DECLARED}
    attrs["name"] = name
    attrs["__module__"] = type(model).__module__
    attrs["__qualname__"] = type(model).__qualname__
    return type(type(model).__name__, (type(model),), attrs)


def register_model(name: str, model_or_factory) -> None:
    """Register a model under ``name`` so that every run-config, the CLI and the parametrised
    model tests accept it (:data:`MODELS`, :data:`ALL_MODELS`, :func:`model_class`,
    :func:`make_model`).

    Parameters
    ----------
    name : str
        The run-config ``model`` value.
    model_or_factory : Model subclass, Model or callable
        A :class:`~fedbayes_flwr.models.base.Model` subclass (built with its ``build``), a built
        model (returned as is: e.g. a :class:`~fedbayes_flwr.models.likelihood.LikelihoodModel`),
        or a factory called like ``Model.build(noise_scale, hidden, num_outputs)`` that returns a
        model (called once with the defaults here, to read the model's attributes).

    Raises
    ------
    ValueError
        ``name`` is already registered for another model (built-in or plugin), or
        ``model_or_factory`` is none of the above.

    Notes
    -----
    Re-registering the same object under the same name is a no-op, so a plugin module may be
    imported (or its registration run) more than once. A built model's name becomes ``name``;
    its class is replaced by a subclass that declares its attributes (see :func:`model_class`).

    References
    ----------
    The same contract as :func:`fedbayes_flwr.algorithms.registry.register` (plugins loaded by
    the ``algorithm-modules`` key).
    """
    global MODELS, ALL_MODELS
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"model name must be a non-empty string without surrounding blanks, "
                         f"got {name!r}")
    with _LOCK:
        if name in _SOURCES and _SOURCES[name] is model_or_factory:
            return
        if name in _CLASSES or name in _STRUCTURED:
            what = "a plugin" if name in _SOURCES else "the built-in"
            owner = _CLASSES[name] if name in _CLASSES else _STRUCTURED[name]
            raise ValueError(f"model {name!r} is already registered ({what} "
                             f"{owner.__qualname__}); choose another name")
        if isinstance(model_or_factory, type) and issubclass(model_or_factory, Model):
            cls = model_or_factory
        elif isinstance(model_or_factory, Model):
            model = model_or_factory
            taken = [n for n, m in _BUILT.items() if m is model]
            if taken:
                raise ValueError(f"model {name!r}: this model is already registered as "
                                 f"{taken[0]!r}")
            model.name = name
            cls = _own_class(name, model)
            model.__class__ = cls
            _BUILT[name] = model
        elif callable(model_or_factory):
            factory = model_or_factory
            sample = factory(1.0, (50,), 1)
            if not isinstance(sample, Model):
                raise ValueError(f"model {name!r}: the factory returned "
                                 f"{type(sample).__name__}, not a Model")
            base = _own_class(name, sample)

            def build(_cls, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
                      num_outputs: int = 1) -> Model:
                model = factory(noise_scale, tuple(hidden), num_outputs)
                model.name = name
                model.__class__ = _cls
                return model

            cls = type(base.__name__, (base,), {"build": classmethod(build),
                                                "__module__": base.__module__,
                                                "__qualname__": base.__qualname__})
        else:
            raise ValueError(f"model {name!r}: expected a Model subclass, a Model or a factory, "
                             f"got {type(model_or_factory).__name__}")
        if cls is model_or_factory and cls.name != name:
            raise ValueError(f"model {name!r}: class {cls.__qualname__} declares name "
                             f"{cls.name!r}")
        _CLASSES[name] = cls
        _SOURCES[name] = model_or_factory
        MODELS = tuple(_CLASSES)
        ALL_MODELS = MODELS + STRUCTURED_MODELS
        make_model.cache_clear()


def _describe(value, depth: int = 0) -> object:
    """A process-independent description of an attribute value (no addresses, no ids)."""
    if isinstance(value, bool | int | float | str | type(None)):
        return value
    if isinstance(value, tuple | list) and depth < 3:
        return [_describe(v, depth + 1) for v in value]
    if isinstance(value, np.ndarray):
        return [value.dtype.str, list(value.shape), hashlib.sha256(value.tobytes()).hexdigest()]
    code = getattr(value, "__code__", None)
    if code is not None:  # a function: where it is defined and what it does
        consts = [c for c in code.co_consts if isinstance(c, bool | int | float | str)]
        return [getattr(value, "__module__", ""), getattr(value, "__qualname__", ""),
                code.co_code.hex(), consts, list(code.co_names)]
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _is_object(value) -> bool:
    return not isinstance(value, bool | int | float | str | type(None) | tuple | list | np.ndarray) \
        and getattr(value, "__code__", None) is None


def stable_name(model: Model) -> str:
    """A registry name for the model object ``model`` that every process building the same
    model computes alike (two Flower apps, Ray actors, a SuperNode's per-message process).

    Its registered name when ``model`` is registered already; else ``app-<class>-<digest>``, the
    digest over the class, the model's ``name`` and its plain attributes (numbers, strings,
    arrays, functions by module, qualified name and byte code; other objects by type only,
    private ones not at all). Compute it before the model is first used (a cache attribute
    that holds a number would change it), or pin a name of your own.
    """
    name = getattr(model, "name", "")
    if _BUILT.get(name) is model:
        return name
    cls = type(model)
    # private objects (caches such as compiled functions) may appear once the model is used
    items = sorted((k, _describe(v)) for k, v in vars(model).items()
                   if k != "name" and not (k.startswith("_") and _is_object(v)))
    text = json.dumps([cls.__module__, cls.__qualname__, name, items], default=str)
    return f"app-{cls.__name__.lower()}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def register_object(model: Model | str, name: str | None = None) -> str:
    """Register the model object ``model`` under ``name`` (default :func:`stable_name`) in this
    process, unless that name is registered already (a process building the same model again),
    and return the name; a model name (a string) is returned as it is."""
    if isinstance(model, str):
        return model
    if not isinstance(model, Model):
        raise ConfigError(f"model: expected a model name or a Model, got {type(model).__name__}")
    name = name or stable_name(model)
    with _LOCK:
        if name not in _SOURCES:  # else this or an equal object (same digest) is registered
            register_model(name, model)
    return name


def load_model_modules(spec: str) -> None:
    """Import the comma-separated plugin modules of the ``model-modules`` run-config key (each
    registers its models with :func:`register_model` when imported).

    Raises
    ------
    ConfigError
        One line, ``model-modules: cannot import 'x' (...)``, for a module that cannot be
        imported.
    """
    for module in (m.strip() for m in (spec or "").split(",")):
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"model-modules: cannot import {module!r} ({err})") from None


def model_class(name: str) -> type[Model]:
    """The class registered as ``name`` (see :data:`MODELS`), without building it."""
    try:
        return _CLASSES[name] if name in _CLASSES else _STRUCTURED[name]  # type: ignore[return-value]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(ALL_MODELS)}") from None


def describe_model(name: str) -> str:
    """One line about the model registered as ``name``: the first line of its class docstring
    (reST markup removed) or a plugin model's ``description`` attribute, its target kind, and,
    for a plugin, the module that registered it (``run_simulation.py list models``).

    Raises
    ------
    ValueError
        ``name`` is not registered.

    References
    ----------
    numpydoc's docstring standard (the summary line is the first paragraph); the registration
    contract of :func:`register_model`.
    """
    cls = model_class(name)
    source = _SOURCES.get(name)
    fn = getattr(source, "log_likelihood_fn", None)  # a LikelihoodModel: its user's function
    doc = str(getattr(source, "description", "") or getattr(fn, "__doc__", "") or cls.__doc__ or "")
    if fn is not None and not getattr(fn, "__doc__", None):
        doc = f"LikelihoodModel of {getattr(fn, '__qualname__', 'a log-likelihood')}"
    line = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, as one line
    line = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", line).replace("``", "")
    line = re.sub(rf"^{re.escape(name)}:\s*", "", line).rstrip(".")
    if len(line) > 90:
        line = line[:87].rsplit(" ", 1)[0] + " ..."
    target = getattr(cls, "target", "none")
    where = ""
    if source is not None:
        module = getattr(fn or source, "__module__", None) or type(source).__module__
        where = f"; plugin from {module}"
    elif name in _STRUCTURED:
        where = "; AMPS family only"
    return f"{line or cls.__qualname__} (target: {target}{where})"


@functools.cache
def make_model(name: str, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
               num_outputs: int = 1) -> Model:
    """The model called ``name`` (see :data:`MODELS`); one shared instance per arguments, so the
    compiled local optimiser and log density are traced once per model, not once per call.

    ``hidden`` (hidden-layer widths) and ``num_outputs`` (classes) apply to the BNN models only;
    a plugin's built model (:func:`register_model`) is returned as it is.
    """
    if name in _BUILT:
        return _BUILT[name]
    return model_class(name).build(noise_scale, tuple(hidden), num_outputs)


def exact_posterior(model: Model, prior: NaturalGaussian, x, y) -> NaturalGaussian:
    """Exact posterior of a conjugate model on the pooled data (full covariance)."""
    factor = model.likelihood_factor(x, y)
    if factor is None:
        raise ValueError(f"model {model.name!r} has no closed-form posterior")
    return G.add(G.like(factor, prior), factor)
