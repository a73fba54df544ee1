"""User datasets from ``.npz`` files.

Keys: ``x_train`` (required), ``y_train`` (required unless the target kind is
``"none"``), ``x_test`` and ``y_test`` (optional, together), ``client_id`` (optional).
User data is not standardised.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from fedbayes_flwr.data.base import (
    DataError,
    Dataset,
    DataWarning,
    as_x,
    as_y,
    f64,
    i64,
    needs,
    num_test_rows,
)

__all__ = ["check_npz_file", "load_npz"]


def npz_shape(path: str, key: str) -> tuple[int, ...] | None:
    """The shape of array ``key`` in the ``.npz`` file ``path``, read from its ``.npy`` header
    only (no data read); None when it cannot be read (:func:`load_npz` then says why).

    References
    ----------
    NumPy Enhancement Proposal 1, "A simple file format for NumPy arrays" (the header).
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive, archive.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape = read(f)[0]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError):
        return None
    return tuple(int(n) for n in shape)


def check_npz_file(path: str, target: str) -> None:
    """Check what can be checked without reading the arrays: the file exists, is a ``.npz``
    archive whose directory can be read, and holds the keys a model needing ``target`` uses.

    Cheap (the zip directory only), so the CLI runs it before importing TensorFlow and Flower;
    :func:`load_npz` runs it first too.

    Parameters
    ----------
    path : str
        Path of the ``.npz`` file.
    target : str
        The target kind the model needs, one of :data:`fedbayes_flwr.data.TARGETS`.

    Raises
    ------
    DataError
        When the file is missing, not a ``.npz`` archive, unreadable, lacks ``x_train`` (or
        ``y_train`` when targets are needed), or has only one of ``x_test`` and ``y_test``.

    References
    ----------
    NumPy Enhancement Proposal 1, "A simple file format for NumPy arrays" (``.npz`` is a zip
    archive of ``.npy`` members; its directory is read without the arrays).
    """
    where = f"data file {path!r}"
    if os.path.isdir(path):
        raise DataError(f"{where} is a directory, not a .npz file")
    if not os.path.isfile(path):
        raise DataError(f"{where} does not exist")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise DataError(f"{where} cannot be read: {exc.strerror}") from None
    if magic != b"PK\x03\x04" and magic != b"PK\x05\x06":  # a zip archive (what np.savez writes)
        kind = "a single-array .npy file" if magic.startswith(b"\x93NUM") else "not a zip archive"
        raise DataError(f"{where} is not a .npz archive ({kind}); save the arrays with "
                        f"numpy.savez(path, x_train=..., y_train=...)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
    except Exception as exc:  # any read failure is a data error
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where} is not a readable .npz file: {msg}") from None
    if "x_train" not in keys:
        raise DataError(f"{where}: missing required key 'x_train'")
    needs_y = target != "none"
    if needs_y and "y_train" not in keys:
        raise DataError(f"{where}: key 'y_train' is required: this model needs {needs(target)}")
    has_xt, has_yt = "x_test" in keys, "y_test" in keys
    if needs_y and has_xt != has_yt:
        given, missing = ("x_test", "y_test") if has_xt else ("y_test", "x_test")
        raise DataError(f"{where}: key '{given}' is given without '{missing}'")


def load_npz(path: str, target: str, *, seed: int, test_fraction: float) -> Dataset:
    """Load a user ``.npz`` file for a model needing `target`.

    Parameters
    ----------
    path : str
        Path of the ``.npz`` file.
    target : str
        The target kind the model needs, one of :data:`fedbayes_flwr.data.TARGETS`;
        with ``"none"`` the targets in the file, if any, are not read.
    seed : int
        Seed of the permutation that picks the held-out test rows when the file has no
        ``x_test``.
    test_fraction : float
        Fraction of the training rows held out as test set when the file has no
        ``x_test``, in (0, 1).

    Returns
    -------
    Dataset
        Named ``"file:<basename>"``. ``holdout_rows`` is the number of rows held out
        (0 when the file has ``x_test``); when rows are held out a :class:`DataWarning`
        says so.

    Raises
    ------
    DataError
        When the file is missing, unreadable or its arrays are invalid for `target`.
    """
    where = f"data file {path!r}"
    check_npz_file(path, target)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: np.asarray(npz[key]) for key in npz.files}
    except Exception as exc:  # any read failure is a data error
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where} is not a readable .npz file: {msg}") from None

    needs_y = target != "none"
    x_train = as_x(arrays["x_train"], "x_train", where)
    n, d = x_train.shape

    y_train = None
    if needs_y:
        y_train = as_y(arrays["y_train"], "y_train", where, target)
        if y_train.shape[0] != n:
            raise DataError(
                f"{where}: key 'y_train' has {y_train.shape[0]} rows but 'x_train' has {n}"
            )

    client_id = None
    if "client_id" in arrays:
        cid = arrays["client_id"]
        if cid.ndim != 1:
            raise DataError(f"{where}: key 'client_id' must be 1-D, got shape {cid.shape}")
        if cid.dtype.kind not in "iub":
            raise DataError(f"{where}: key 'client_id' must be integers, got dtype {cid.dtype}")
        if cid.shape[0] != n:
            raise DataError(
                f"{where}: key 'client_id' has {cid.shape[0]} entries but 'x_train' has {n} rows"
            )
        if cid.size and cid.min() < 0:
            raise DataError(f"{where}: key 'client_id' must be >= 0, found {int(cid.min())}")
        if cid.size and int(cid.max()) > np.iinfo(np.int64).max:  # a uint64 would wrap negative
            raise DataError(f"{where}: key 'client_id' must fit in int64 (<= 2**63 - 1), found "
                            f"{int(cid.max())}")
        client_id = i64(cid)

    has_xt = "x_test" in arrays
    holdout = 0
    if has_xt:
        x_test = as_x(arrays["x_test"], "x_test", where)
        if x_test.shape[1] != d:
            raise DataError(
                f"{where}: key 'x_test' has {x_test.shape[1]} features but 'x_train' has {d}"
            )
        y_test = None
        if needs_y:
            y_test = as_y(arrays["y_test"], "y_test", where, target)
            if y_test.shape[0] != x_test.shape[0]:
                raise DataError(
                    f"{where}: key 'y_test' has {y_test.shape[0]} rows "
                    f"but 'x_test' has {x_test.shape[0]}"
                )
    else:
        if n < 2:
            raise DataError(f"{where}: key 'x_train' needs at least 2 rows to split off a test set")
        holdout = num_test_rows(n, test_fraction)
        perm = np.random.default_rng(seed).permutation(n)
        test_rows, train_rows = np.sort(perm[:holdout]), np.sort(perm[holdout:])
        x_test, x_train = f64(x_train[test_rows]), f64(x_train[train_rows])
        y_test = None
        if y_train is not None:
            y_test = np.ascontiguousarray(y_train[test_rows])
            y_train = np.ascontiguousarray(y_train[train_rows])
        if client_id is not None:
            client_id = i64(client_id[train_rows])
        warnings.warn(
            f"{where} has no x_test: held out {holdout} of {n} rows "
            f"(test-fraction {test_fraction:g}, seed {seed}) as the test set",
            DataWarning,
            stacklevel=3,
        )

    return Dataset(
        x_train, y_train, x_test, y_test, client_id, f"file:{os.path.basename(path)}", holdout
    )
