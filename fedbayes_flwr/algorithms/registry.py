"""The registry: every name a user can pass -> (bundle, preset).

The CLI's choices, the config validation, the ServerApp and the ClientApp's message routing
(``train.<bundle>``) are all derived from this table, so adding a family is one bundle module and
one line in :data:`BUILTIN_MODULES` (or, for code outside this package, a module named in the
``algorithm-modules`` run-config key that calls :func:`register` when imported: both apps import
it, so the registration reaches the CLI subprocess, Ray actors and deployed nodes).

A family module exposes ``registrations()`` returning ``(name, bundle, preset, description)``
tuples; :func:`_load_builtins` and :func:`load_modules` import the module and register them
(calling it, not relying on import side effects: a host that re-imports this registry module,
as Flower's app loader can, still finds every name). A plugin may instead call :func:`register`
when imported. A built-in that cannot be imported (e.g. blocked in a test) is reported, not
hidden: its names are absent and :func:`get` says why.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import NamedTuple

from fedbayes_flwr.algorithms.base import Bundle
from fedbayes_flwr.errors import ConfigError

# One line per family: the module whose import registers it.
BUILTIN_MODULES = ("fedbayes_flwr.algorithms.pvi", "fedbayes_flwr.algorithms.dsvgd",
                   "fedbayes_flwr.algorithms.sgld", "fedbayes_flwr.algorithms.fedavg",
                   "fedbayes_flwr.algorithms.amps", "fedbayes_flwr.algorithms.pdmc",
                   "fedbayes_flwr.algorithms.dhmc")


class Entry(NamedTuple):
    """A registered name: its bundle, an optional preset (``RunConfig -> RunConfig``, fixing the
    keys the name defines) and a one-line description (the family pages' algorithm tables, docs/families/)."""

    name: str
    bundle: Bundle
    preset: Callable | None
    description: str


_ENTRIES: dict[str, Entry] = {}
_UNAVAILABLE: dict[str, str] = {}
_loaded = False
_LOCK = threading.RLock()


def register(name: str, bundle: Bundle, preset: Callable | None = None,
             description: str = "") -> Entry:
    """Register ``name``; re-registering the same bundle is a no-op, a clash is an error."""
    if not bundle.name.isidentifier():
        raise ValueError(f"bundle name {bundle.name!r} must be a Python identifier (it routes "
                         f"Flower messages as train.<name>)")
    old = _ENTRIES.get(name)
    if old is not None and old.bundle.name != bundle.name:
        raise ValueError(f"algorithm {name!r} is already registered for bundle "
                         f"{old.bundle.name!r}")
    entry = Entry(name, bundle, preset, description)
    _ENTRIES[name] = entry
    return entry


def _load_builtins() -> None:
    """Import and register the built-in families once. Thread-safe: Flower's simulation loads
    the ServerApp and ClientApps in threads of one process, and a second thread must wait for
    the first to finish registering rather than see an empty table."""
    global _loaded
    if _loaded:
        return
    with _LOCK:
        if _loaded:
            return
        for module in BUILTIN_MODULES:
            try:
                _register_module(importlib.import_module(module))
            except ImportError as err:
                _UNAVAILABLE[module] = str(err)
        _loaded = True


def _register_module(module) -> None:
    for name, bundle, preset, description in getattr(module, "registrations", tuple)():
        register(name, bundle, preset, description)


def load_modules(spec: str) -> None:
    """Import the comma-separated plugin modules of the ``algorithm-modules`` key."""
    for module in (m.strip() for m in (spec or "").split(",")):
        if not module:
            continue
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"algorithm-modules: cannot import {module!r} ({err})") from None
        _register_module(imported)


def names() -> tuple[str, ...]:
    """Every registered algorithm name, in registration order."""
    _load_builtins()
    return tuple(_ENTRIES)


def bundles() -> dict[str, Bundle]:
    """``{bundle name: bundle}`` over every registered name (presets share their bundle)."""
    _load_builtins()
    return {e.bundle.name: e.bundle for e in _ENTRIES.values()}


def entries() -> tuple[Entry, ...]:
    _load_builtins()
    return tuple(_ENTRIES.values())


def get(name: str) -> Entry:
    """The entry of ``name``, or :class:`ConfigError` naming the known ones."""
    _load_builtins()
    if name in _ENTRIES:
        return _ENTRIES[name]
    known = ", ".join(_ENTRIES) or "none"
    missing = "".join(f"; {m} unavailable ({why})" for m, why in _UNAVAILABLE.items())
    raise ConfigError(f"algorithm: unknown algorithm {name!r}; choose one of {known}{missing} "
                      f"(or load a plugin with algorithm-modules)")
