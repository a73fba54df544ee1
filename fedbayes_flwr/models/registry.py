"""The model registry: one line per model class, plus the models that plugins register.

Adding a model = one :class:`~fedbayes_flwr.models.base.Model` subclass (with ``name``, ``target``,
``synthetic``, ``deterministic_expectations``, ``log_likelihood_rows_tf`` and ``predictive``) and
one entry in ``_CLASSES``; :func:`model_names`, the CLI choices and the parametrised model tests
follow.

Code outside the package adds a model with :func:`register_model` (a class, a built model such as
a :class:`~fedbayes_flwr.models.likelihood.LikelihoodModel`, or a factory), typically in a module
named in the ``model-modules`` run-config key, which the CLI, both Flower apps and a resumed run
import with :func:`load_model_modules` before they validate ``model``. ``MODELS`` and
``ALL_MODELS`` (module attributes) are computed at each access by :func:`model_names`, so
``registry.MODELS`` includes the plugins registered since (``from ... import MODELS`` binds the
tuple of that moment).
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
"""The built-in models over one parameter vector, and the plugins' classes."""
_STRUCTURED = {cls.name: cls for cls in STRUCTURED_CLASSES}
STRUCTURED_MODELS: tuple[str, ...] = tuple(_STRUCTURED)
"""Mean-field exponential-family models with label symmetry (the AMPS family only)."""

_SOURCES: dict[str, object] = {}
"""``{name: what register_model received}`` for every plugin model (re-registration check)."""
_BUILT: dict[str, Model] = {}
"""The plugins' already-built models: :func:`make_model` returns them as they are."""
_FACTORIES: dict[str, tuple[object, Model]] = {}
"""``{name: (factory, the model it built with the defaults)}`` for the plugins' factories."""
_LOCK = threading.RLock()


def model_names(*, structured: bool = True) -> tuple[str, ...]:
    """The registered model names, plugins included (as of this call): those over one
    parameter vector (every family runs them), then with ``structured`` the
    :data:`STRUCTURED_MODELS` (AMPS only)."""
    with _LOCK:
        flat = (*_CLASSES, *(n for n in _SOURCES if n not in _CLASSES))
    return flat + STRUCTURED_MODELS if structured else flat


def __getattr__(name: str) -> tuple[str, ...]:
    """``MODELS`` (:func:`model_names` without the structured ones) and ``ALL_MODELS``, read
    at each access, so that they include the plugins registered since."""
    if name == "MODELS":
        return model_names(structured=False)
    if name == "ALL_MODELS":
        return model_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_model(name: str, model_or_factory) -> None:
    """Register a model under ``name`` so that every run-config, the CLI and the parametrised
    model tests accept it (:func:`model_names`, :func:`model_spec`, :func:`make_model`).

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
    imported (or its registration run) more than once. A built model's ``name`` attribute
    becomes ``name``; nothing else about it changes.

    References
    ----------
    The same contract as :func:`fedbayes_flwr.algorithms.registry.register` (plugins loaded by
    the ``algorithm-modules`` key).
    """
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"model name must be a non-empty string without surrounding blanks, "
                         f"got {name!r}")
    with _LOCK:
        if name in _SOURCES and _SOURCES[name] is model_or_factory:
            return
        if name in _SOURCES or name in _CLASSES or name in _STRUCTURED:
            what = "a plugin" if name in _SOURCES else "the built-in"
            owner = _SOURCES.get(name) or _CLASSES.get(name) or _STRUCTURED[name]
            label = getattr(owner, "__qualname__", type(owner).__qualname__)
            raise ValueError(f"model {name!r} is already registered ({what} {label}); choose "
                             f"another name")
        if isinstance(model_or_factory, type) and issubclass(model_or_factory, Model):
            if model_or_factory.name != name:
                raise ValueError(f"model {name!r}: class {model_or_factory.__qualname__} declares "
                                 f"name {model_or_factory.name!r}")
            _CLASSES[name] = model_or_factory
        elif isinstance(model_or_factory, Model):
            model = model_or_factory
            taken = [n for n, m in _BUILT.items() if m is model]
            if taken:
                raise ValueError(f"model {name!r}: this model is already registered as "
                                 f"{taken[0]!r}")
            model.name = name
            _BUILT[name] = model
        elif callable(model_or_factory):
            sample = model_or_factory(1.0, (50,), 1)
            if not isinstance(sample, Model):
                raise ValueError(f"model {name!r}: the factory returned "
                                 f"{type(sample).__name__}, not a Model")
            sample.name = name
            _FACTORIES[name] = (model_or_factory, sample)
        else:
            raise ValueError(f"model {name!r}: expected a Model subclass, a Model or a factory, "
                             f"got {type(model_or_factory).__name__}")
        _SOURCES[name] = model_or_factory
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


def model_spec(name: str) -> type[Model] | Model:
    """What declares the attributes of the model registered as ``name`` (``target``,
    ``synthetic``, ``task``, ...; see :mod:`fedbayes_flwr.models.base`), without building it:
    its class, or for a plugin's built model (or factory) that model (the one built with the
    defaults)."""
    with _LOCK:
        if name in _CLASSES:
            return _CLASSES[name]
        if name in _STRUCTURED:
            return _STRUCTURED[name]  # type: ignore[return-value]
        if name in _BUILT:
            return _BUILT[name]
        if name in _FACTORIES:
            return _FACTORIES[name][1]
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")


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
    cls = model_spec(name)
    source = _SOURCES.get(name)
    fn = getattr(source, "log_likelihood_fn", None)  # a LikelihoodModel: its user's function
    doc = str(getattr(source, "description", "") or getattr(fn, "__doc__", "")
              or cls.__doc__ or "")
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
    label = (cls if isinstance(cls, type) else type(cls)).__qualname__
    return f"{line or label} (target: {target}{where})"


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
    if name in _FACTORIES:
        model = _FACTORIES[name][0](noise_scale, tuple(hidden), num_outputs)  # type: ignore[operator]
        if not isinstance(model, Model):
            raise ValueError(f"model {name!r}: the factory returned {type(model).__name__}, "
                             f"not a Model")
        model.name = name
        return model
    spec = model_spec(name)
    assert isinstance(spec, type)
    return spec.build(noise_scale, tuple(hidden), num_outputs)


def exact_posterior(model: Model, prior: NaturalGaussian, x, y) -> NaturalGaussian:
    """Exact posterior of a conjugate model on the pooled data (full covariance)."""
    factor = model.likelihood_factor(x, y)
    if factor is None:
        raise ValueError(f"model {model.name!r} has no closed-form posterior")
    return G.add(G.like(factor, prior), factor)
