"""Pure validation of a decoded message against its template: shape, dtype, finiteness.

The in-process engine and the Flower strategy call the same function, so a reply is judged the
same way whether it crossed a network or not. Finiteness is a per-field rule: a field listed in
``allow_inf`` may hold +/-inf (a PDMC event time meaning "no event before the horizon"); NaN is
never valid.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference.tree import is_namedtuple


def check_message(template, message, allow_inf: frozenset | tuple = (),
                  prefix: str = "", exact_shapes: bool = True) -> tuple[str, str] | None:
    """Return ``(field, reason)`` for the first field of ``message`` that breaks ``template``.

    Parameters
    ----------
    template : NamedTuple
        An instance of the expected type with arrays of the expected shapes and dtypes.
    message : NamedTuple
        The message to check.
    allow_inf : collection of str
        Dotted field names (relative to the message) where infinities are allowed.
    prefix : str
        Dotted name of ``message`` inside an enclosing message (recursion).
    exact_shapes : bool, default True
        False compares only the number of dimensions: for a node's own stored state, which may
        grow (U-DSVGD's factor gains two particle sets per visit). Replies are always exact.

    Returns
    -------
    tuple of (str, str) or None
        The dotted field name and the reason, or ``None`` when the message is valid.
    """
    if type(message) is not type(template):
        return prefix or "message", f"type {type(message).__name__}, expected {type(template).__name__}"
    for name, expected, got in zip(template._fields, template, message, strict=True):
        field = f"{prefix}.{name}" if prefix else name
        if is_namedtuple(expected):
            problem = check_message(expected, got, allow_inf, field, exact_shapes)
            if problem is not None:
                return problem
        elif isinstance(expected, np.ndarray):
            if not isinstance(got, np.ndarray):
                return field, f"type {type(got).__name__}, expected an array"
            if got.dtype != expected.dtype:
                return field, f"dtype {got.dtype}, expected {expected.dtype}"
            if got.shape != expected.shape and (exact_shapes or got.ndim != expected.ndim):
                return field, f"shape {got.shape}, expected {expected.shape}"
            if got.dtype.kind == "f":
                bad = np.isnan(got) if field in allow_inf else ~np.isfinite(got)
                if np.any(bad):
                    return field, "non-finite values"
        elif isinstance(expected, float) and isinstance(got, float):
            if np.isnan(got) or (np.isinf(got) and field not in allow_inf):
                return field, "non-finite value"
    return None
