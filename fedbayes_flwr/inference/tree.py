"""The one walker over the library's messages and states: NamedTuples nested in NamedTuples,
with numpy arrays and Python scalars at the leaves.

The codec (:mod:`fedbayes_flwr.codec`) flattens a message into dotted keys with :func:`leaves`
and rebuilds it from a template with :func:`rebuild`; validation
(:mod:`fedbayes_flwr.runtime.validation`) and checkpoints (:mod:`fedbayes_flwr.runtime.checkpoint`)
recognise nodes with :func:`is_namedtuple`; byte accounting uses :func:`payload_nbytes`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["is_namedtuple", "leaves", "payload_nbytes", "rebuild"]


def is_namedtuple(obj: Any) -> bool:
    """Whether ``obj`` is a NamedTuple instance (a node of the tree, not a leaf)."""
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, leaf)`` for every leaf of ``tree``, depth first in field order; keys are
    ``prefix.field.subfield`` (no leading dot when ``prefix`` is empty)."""
    for name, value in zip(tree._fields, tree, strict=True):
        key = _key(prefix, name)
        if is_namedtuple(value):
            yield from leaves(value, key)
        else:
            yield key, value


def rebuild(template: Any, leaf: Callable[[str, Any], Any], prefix: str = "") -> Any:
    """A tree of ``template``'s types whose leaves are ``leaf(dotted key, template leaf)``."""
    values = []
    for name, expected in zip(template._fields, template, strict=True):
        key = _key(prefix, name)
        values.append(rebuild(expected, leaf, key) if is_namedtuple(expected)
                      else leaf(key, expected))
    return type(template)(*values)


def payload_nbytes(obj: Any) -> int:
    """Bytes of array payload in a message (tuples and NamedTuples of arrays, nested)."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, tuple):
        return sum(payload_nbytes(o) for o in obj)
    return 0
