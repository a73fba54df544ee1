"""The one place where library states and messages meet Flower records.

A message is a (possibly nested) NamedTuple of numpy arrays and scalars. :func:`encode` flattens it
into a ``RecordDict`` with

* one ``ArrayRecord`` (``"arrays"``) holding every array under a flat dotted key
  (``pvi.reply.delta.eta1``),
* one ``ConfigRecord`` (``"config"``) holding every scalar under its dotted key plus
  ``schema-version``.

:func:`decode` rebuilds the NamedTuple against a *template* (an instance of the expected type with
arrays of the expected shapes and dtypes) and validates every field: presence, shape, dtype,
finiteness. A failure raises :class:`CodecError` naming the field, so a bad reply can be rejected
without touching server state. ``decode(encode(m)) == m`` exactly (float64 bits preserved).
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedbayes_flwr.inference import tree
from fedbayes_flwr.runtime.validation import check_message

SCHEMA_VERSION = 1
_ARRAYS, _CONFIG = "arrays", "config"


class CodecError(ValueError):
    """A record could not be decoded; ``field`` names the offending key."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _flatten(obj, prefix: str, arrays: dict, scalars: dict) -> None:
    for key, value in tree.leaves(obj, prefix):
        if isinstance(value, np.ndarray):
            arrays[key] = Array(np.ascontiguousarray(value))
        elif isinstance(value, bool | int | float | str | np.generic):
            scalars[key] = value.item() if isinstance(value, np.generic) else value
        else:
            raise TypeError(f"cannot encode field {key} of type {type(value).__name__}")


def encode(message, kind: str, extra_config: dict | None = None) -> RecordDict:
    """Flatten ``message`` (a NamedTuple) under the key prefix ``kind`` into a ``RecordDict``."""
    arrays, scalars = {}, {}
    _flatten(message, kind, arrays, scalars)
    config = {"schema-version": SCHEMA_VERSION, **scalars, **(extra_config or {})}
    return RecordDict({_ARRAYS: ArrayRecord(arrays), _CONFIG: ConfigRecord(config)})


def _rebuild(template, prefix: str, arrays, config):
    def leaf(key: str, expected):
        if isinstance(expected, np.ndarray):
            if key not in arrays:
                raise CodecError(key, "missing array")
            try:
                return arrays[key].numpy()  # shape, dtype, finiteness: validation.check_message
            except Exception as err:  # malformed bytes: name the field, keep the cause
                raise CodecError(key, f"undecodable array ({err})") from err
        if key not in config:
            raise CodecError(key, "missing config value")
        got = config[key]
        if not _same_scalar_type(expected, got):
            raise CodecError(key, f"type {type(got).__name__}, expected "
                                  f"{type(expected).__name__}")
        return type(expected)(got)

    return tree.rebuild(template, leaf, prefix)


def _same_scalar_type(expected, got) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return isinstance(expected, bool) and isinstance(got, bool)
    if isinstance(expected, float):
        return isinstance(got, int | float)
    return isinstance(got, type(expected))


def decode(content: RecordDict, kind: str, template, allow_inf: frozenset | tuple = (),
           exact_shapes: bool = True):
    """Rebuild a message of ``type(template)`` from ``content``, validating every field.

    Presence and scalar types are checked here; shape, dtype and finiteness by the library's
    pure :func:`fedbayes_flwr.runtime.validation.check_message` (the in-process engine runs the same
    check), with infinities allowed in the ``allow_inf`` fields.

    Raises
    ------
    CodecError
        Missing record or key, wrong schema version, dtype, shape, or non-finite values.
    """
    arrays = content.array_records.get(_ARRAYS)
    config = content.config_records.get(_CONFIG)
    if arrays is None or config is None:
        raise CodecError(kind, "message lacks its 'arrays' or 'config' record")
    version = config.get("schema-version")
    if type(version) is not int or version != SCHEMA_VERSION:  # True and 1.0 equal 1
        raise CodecError("schema-version", f"got {version!r}, expected {SCHEMA_VERSION}")
    try:
        message = _rebuild(template, kind, arrays, config)
    except CodecError as err:  # name the field relative to the message (delta.eta1)
        raise CodecError(err.field.removeprefix(f"{kind}."), err.reason) from None
    problem = check_message(template, message, allow_inf, exact_shapes=exact_shapes)
    if problem is not None:
        raise CodecError(*problem)
    return message


def received_nbytes(content: RecordDict) -> int:
    """Array payload bytes of a received record dict, decodable or not.

    An array's declared ``shape`` and ``dtype`` are the sender's word: when they name no dtype
    or more bytes than arrived, the bytes that arrived are counted instead (never raises)."""
    return sum(_nbytes(a) for record in content.array_records.values() for a in record.values())


def _nbytes(array: Array) -> int:
    try:
        declared = math.prod(int(n) for n in array.shape) * np.dtype(array.dtype).itemsize
    except (TypeError, ValueError, OverflowError):  # e.g. dtype '' or 'garbage'
        declared = -1
    return declared if 0 <= declared <= len(array.data) else len(array.data)


def config_of(content: RecordDict) -> ConfigRecord:
    """The message's ``ConfigRecord`` (scalars, hyper-parameters)."""
    return content.config_records[_CONFIG]


def save_state(records: RecordDict, kind: str, state) -> None:
    """Store a client state NamedTuple in a node's ``context.state`` under ``kind``."""
    encoded = encode(state, kind)
    records[f"{kind}.{_ARRAYS}"] = encoded.array_records[_ARRAYS]
    records[f"{kind}.{_CONFIG}"] = encoded.config_records[_CONFIG]


def load_state(records: RecordDict, kind: str, template):
    """Load what :func:`save_state` stored, or ``None`` if nothing was stored yet.

    Arrays are checked for dtype, rank and finiteness but not for their exact shape: a node's
    own state may grow (U-DSVGD keeps two particle sets per visit)."""
    if f"{kind}.{_ARRAYS}" not in records:
        return None
    content = RecordDict({_ARRAYS: records[f"{kind}.{_ARRAYS}"],
                          _CONFIG: records[f"{kind}.{_CONFIG}"]})
    return decode(content, kind, template, exact_shapes=False)
