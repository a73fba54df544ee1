"""Datasets and client partitions for the federated Bayesian experiments.

Two public entry points:

* :func:`load_dataset` returns a :class:`Dataset` (train/test arrays) from one of the
  embedded sets (:data:`DATASETS`), from a Hugging Face dataset named ``"hub:<id>"``
  (loaded through ``flwr_datasets.FederatedDataset``) or from a user ``.npz`` file.
* :func:`partition_indices` splits the training rows over clients with one of the
  schemes in :data:`PARTITIONS`, using the partitioners of ``flwr-datasets``.

Bad data or configuration raises :class:`DataError` with a one-line message.
"""

from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import numpy as np

from .models import MODELS

__all__ = [
    "DATASETS",
    "MODELS",
    "PARTITIONS",
    "HUB_PREFIX",
    "DataError",
    "Dataset",
    "is_dataset_name",
    "load_dataset",
    "partition_indices",
]

DATASETS = ("breast-cancer", "diabetes", "digits", "synthetic")
"""Names of the embedded datasets accepted by :func:`load_dataset`."""

HUB_PREFIX = "hub:"
"""Prefix of dataset names loaded from the Hugging Face Hub, e.g. ``"hub:mnist"``."""

PARTITIONS = ("iid", "dirichlet", "pathological", "natural")
"""Names of the partition schemes accepted by :func:`partition_indices`."""


_MAX_LABEL_BINS = 10
_DIRICHLET_RESTARTS = 50

# Target conventions per model name (see fedbayes_flwr.models.MODELS).
_BINARY_MODELS = ("logistic-regression",)
_MULTICLASS_MODELS = ("bnn-classifier",)
_REGRESSION_MODELS = ("linear-regression", "bnn-regression")

# Column names tried, in order, when a hub dataset's columns are not given.
_HUB_IMAGE_COLUMNS = ("image", "img", "pixels")
_HUB_LABEL_COLUMNS = ("label", "labels", "fine_label")
_HUB_RESERVED_KWARGS = ("dataset", "partitioners", "preprocessor")


class DataError(ValueError):
    """Bad user data or data configuration; the message is one line saying what is wrong."""


class Dataset(NamedTuple):
    """A train/test dataset.

    Attributes
    ----------
    x_train : numpy.ndarray
        Training inputs, float64 of shape ``(n, d)``.
    y_train : numpy.ndarray or None
        Training targets: float64 ``(n,)`` for regression (``linear-regression``,
        ``bnn-regression``), int64 ``(n,)`` for classification (in {0, 1} for
        ``logistic-regression``, integers ``>= 0`` for ``bnn-classifier``), ``None`` for
        the gaussian-mean model.
    x_test : numpy.ndarray
        Test inputs, float64 of shape ``(m, d)`` with ``m >= 1``.
    y_test : numpy.ndarray or None
        Test targets, same conventions as `y_train`.
    client_id : numpy.ndarray or None
        int64 ``(n,)`` natural client id of each training row, or ``None``.
    name : str
        Dataset name (``"file:<basename>"`` for user files, ``"hub:<id>"`` for hub
        datasets).
    """

    x_train: np.ndarray
    y_train: np.ndarray | None
    x_test: np.ndarray
    y_test: np.ndarray | None
    client_id: np.ndarray | None
    name: str


# --------------------------------------------------------------------------- loading


def is_dataset_name(name: str) -> bool:
    """Whether `name` is a dataset name :func:`load_dataset` accepts.

    Parameters
    ----------
    name : str
        A name from :data:`DATASETS`, or ``"hub:<dataset-id>"`` with a non-empty id.

    Returns
    -------
    bool
        ``True`` for an embedded dataset or a hub name; whether a hub dataset exists is
        only known when it is loaded.
    """
    return name in DATASETS or (name.startswith(HUB_PREFIX) and bool(name[len(HUB_PREFIX):].strip()))


def load_dataset(
    name: str,
    model: str,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    data_file: str = "",
    synthetic_size: int = 200,
    synthetic_dim: int = 3,
    noise_scale: float = 1.0,
    hub_kwargs: dict | None = None,
    hub_feature_column: str | list[str] | tuple[str, ...] | None = None,
    hub_label_column: str | None = None,
) -> Dataset:
    """Load an embedded dataset, a hub dataset or a user ``.npz`` file for a model.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`, or ``"hub:<dataset-id>"`` (e.g. ``"hub:mnist"``,
        ``"hub:ylecun/mnist"``) for a Hugging Face dataset. Ignored when `data_file`
        is given. The embedded sets are

        * ``"breast-cancer"``: 569 x 30, binary labels, standardised features; for
          ``logistic-regression`` or ``bnn-classifier``.
        * ``"diabetes"``: 442 x 10 regression, features and target standardised; for
          ``linear-regression`` or ``bnn-regression``.
        * ``"digits"``: scikit-learn's 1797 8x8 handwritten digits, 64 pixel features
          scaled to [0, 1] by dividing by 16 (not standardised, so the pixels keep their
          meaning), 10 classes; for ``bnn-classifier``.
        * ``"synthetic"``: generated from `seed` for any model (see below).
    model : str
        One of :data:`fedbayes_flwr.models.MODELS`: ``"gaussian-mean"``,
        ``"linear-regression"``, ``"logistic-regression"``, ``"bnn-classifier"`` or
        ``"bnn-regression"``.
    seed : int, optional
        Seed for synthetic data and for the test split of user files. The embedded
        real datasets use a fixed split (``random_state=0``, stratified for
        classification) independent of `seed`, so results are comparable across seeds;
        so do hub datasets without a ``"test"`` split.
    test_fraction : float, optional
        Fraction of rows held out as test set, in (0, 1). Not used when the data
        file supplies ``x_test`` or the hub dataset has a ``"test"`` split.
    data_file : str, optional
        Path of a ``.npz`` file with keys ``x_train`` (required), ``y_train``,
        ``x_test``, ``y_test`` and ``client_id`` (optional). User data is not
        standardised.
    synthetic_size : int, optional
        Total number of rows (train plus test) of the synthetic dataset.
    synthetic_dim : int, optional
        Input dimension of the synthetic dataset.
    noise_scale : float, optional
        Observation noise standard deviation of the synthetic gaussian-mean,
        linear-regression and bnn-regression data. Synthetic data are: gaussian-mean
        ``x ~ N(mu, noise^2 I)``; linear-regression ``y = x.w + noise``;
        logistic-regression ``y ~ Bernoulli(sigmoid(x.w + b))``; bnn-classifier 3
        classes drawn from a random linear softmax model ``softmax(x W + b)``;
        bnn-regression ``y = 2 sin(2 x.w) + noise`` with ``w ~ N(0, I / d)``.
    hub_kwargs : dict or None, optional
        Hub datasets only: extra keyword arguments of
        ``flwr_datasets.FederatedDataset`` (e.g. ``subset``, ``shuffle``, ``seed``),
        which passes the ones it does not know on to ``datasets.load_dataset`` (e.g.
        ``data_files``, ``cache_dir``, ``revision``). A local dataset takes the same
        code path: ``name="hub:parquet"`` with
        ``hub_kwargs={"data_files": {"train": ..., "test": ...}}``. ``shuffle``
        defaults to ``False`` here (rows kept in source order).
    hub_feature_column : str or sequence of str or None, optional
        Hub datasets only: the input column(s). By default the first of ``"image"``,
        ``"img"``, ``"pixels"`` present, else every scalar numeric column other than the
        label. Each row is flattened; several columns are concatenated.
    hub_label_column : str or None, optional
        Hub datasets only: the target column. By default the first of ``"label"``,
        ``"labels"``, ``"fine_label"`` present.

    Returns
    -------
    Dataset
        Float arrays are float64 and C-contiguous.

    Raises
    ------
    DataError
        On an unknown model or dataset, a dataset that does not fit the model, bad
        parameters, an invalid data file or a hub dataset that cannot be loaded.

    Notes
    -----
    Hub datasets are loaded with ``FederatedDataset(dataset=<id>, partitioners={"train":
    IidPartitioner(1)}, ...)``: the single train partition is the training set and
    ``load_split("test")`` the test set. When there is no ``"test"`` split,
    `test_fraction` of the training rows are held out with a fixed permutation (seed
    0). Image columns (a ``datasets.Image`` feature or a column named ``"image"``,
    ``"img"`` or ``"pixels"``) are flattened and scaled to [0, 1]: integer pixels in
    0..255 are divided by 255, other unsigned 16-bit pixels by 65535, float pixels are
    kept as they are. Other feature columns are not rescaled.
    """
    if model not in MODELS:
        raise DataError(f"unknown model {model!r}; known models: {', '.join(MODELS)}")
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be strictly between 0 and 1, got {test_fraction}")
    if data_file:
        return _load_npz(data_file, model, seed=seed, test_fraction=test_fraction)
    if name == "breast-cancer":
        return _load_breast_cancer(model, test_fraction)
    if name == "diabetes":
        return _load_diabetes(model, test_fraction)
    if name == "digits":
        return _load_digits(model, test_fraction)
    if name == "synthetic":
        return _make_synthetic(
            model,
            seed=seed,
            test_fraction=test_fraction,
            size=synthetic_size,
            dim=synthetic_dim,
            noise_scale=noise_scale,
        )
    if name.startswith(HUB_PREFIX):
        return _load_hub(
            name,
            model,
            test_fraction=test_fraction,
            hub_kwargs=hub_kwargs,
            feature_column=hub_feature_column,
            label_column=hub_label_column,
        )
    raise DataError(
        f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)} "
        f"or {HUB_PREFIX}<dataset-id>"
    )


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardise `train` and `test` with the training mean and std (ddof=0)."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return _f64((train - mean) / std), _f64((test - mean) / std)


def _load_breast_cancer(model: str, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    if model not in _BINARY_MODELS + _MULTICLASS_MODELS:
        raise DataError(
            "dataset 'breast-cancer' is a binary classification set; "
            "use --model logistic-regression or bnn-classifier"
        )
    x, y = load_breast_cancer(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=0, stratify=y
    )
    x_tr, x_te = _standardise(x_tr, x_te)
    return Dataset(x_tr, _i64(y_tr), x_te, _i64(y_te), None, "breast-cancer")


def _load_diabetes(model: str, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    if model not in _REGRESSION_MODELS:
        raise DataError(
            "dataset 'diabetes' is a regression set; use --model linear-regression or bnn-regression"
        )
    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=0)
    x_tr, x_te = _standardise(x_tr, x_te)
    y_tr, y_te = _standardise(y_tr, y_te)
    return Dataset(x_tr, y_tr, x_te, y_te, None, "diabetes")


def _load_digits(model: str, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if model not in _MULTICLASS_MODELS:
        raise DataError("dataset 'digits' is a 10-class classification set; use --model bnn-classifier")
    x, y = load_digits(return_X_y=True)
    try:
        x_tr, x_te, y_tr, y_te = train_test_split(
            x, y, test_size=test_fraction, random_state=0, stratify=y
        )
    except ValueError as exc:  # e.g. a test set smaller than the number of classes
        raise DataError(f"dataset 'digits': cannot split with test fraction {test_fraction}: {exc}") from None
    # Pixel intensities are 0..16: scale to [0, 1], no standardisation.
    return Dataset(_f64(x_tr / 16.0), _i64(y_tr), _f64(x_te / 16.0), _i64(y_te), None, "digits")


def _num_test_rows(n: int, test_fraction: float) -> int:
    """Number of test rows: ``round(test_fraction * n)``, at least 1 on each side."""
    return int(min(max(1, round(test_fraction * n)), n - 1))


_SYNTHETIC_CLASSES = 3


def _make_synthetic(
    model: str, *, seed: int, test_fraction: float, size: int, dim: int, noise_scale: float
) -> Dataset:
    size, dim, noise_scale = int(size), int(dim), float(noise_scale)
    if size < 2:
        raise DataError(f"synthetic size must be at least 2 rows, got {size}")
    if dim < 1:
        raise DataError(f"synthetic dimension must be at least 1, got {dim}")
    if not (np.isfinite(noise_scale) and noise_scale > 0):
        raise DataError(f"noise scale must be a positive number, got {noise_scale}")
    rng = np.random.default_rng(seed)
    n_test = _num_test_rows(size, test_fraction)
    n_train = size - n_test
    y: np.ndarray | None
    if model == "gaussian-mean":
        mean = rng.standard_normal(dim)
        x = mean + noise_scale * rng.standard_normal((size, dim))
        y = None
    elif model == "linear-regression":
        x = rng.standard_normal((size, dim))
        w = rng.standard_normal(dim)
        y = _f64(x @ w + noise_scale * rng.standard_normal(size))
    elif model == "logistic-regression":
        x = rng.standard_normal((size, dim))
        w = rng.standard_normal(dim)
        b = rng.standard_normal()
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        y = _i64(rng.random(size) < p)
    elif model == "bnn-classifier":
        x = rng.standard_normal((size, dim))
        w = 2.0 * rng.standard_normal((dim, _SYNTHETIC_CLASSES))
        b = rng.standard_normal(_SYNTHETIC_CLASSES)
        logits = x @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        cum = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
        u = rng.random((size, 1))
        y = _i64(np.minimum((u > cum).sum(axis=1), _SYNTHETIC_CLASSES - 1))
    elif model == "bnn-regression":
        x = rng.standard_normal((size, dim))
        w = rng.standard_normal(dim) / np.sqrt(dim)
        y = _f64(2.0 * np.sin(2.0 * (x @ w)) + noise_scale * rng.standard_normal(size))
    else:
        raise DataError(f"no synthetic data for model {model!r}")
    x = _f64(x)
    return Dataset(
        _f64(x[:n_train]),
        None if y is None else np.ascontiguousarray(y[:n_train]),
        _f64(x[n_train:]),
        None if y is None else np.ascontiguousarray(y[n_train:]),
        None,
        "synthetic",
    )


# ------------------------------------------------------------------------- hub


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """First non-empty line of an exception message (or its type name), shortened."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hub_holdout(dataset_id: str, test_fraction: float):
    """``FederatedDataset`` preprocessor: check the train split, hold out a test split if absent."""

    def preprocess(dd):
        import datasets

        if "train" not in dd:
            raise DataError(
                f"hub dataset {dataset_id!r} has no 'train' split (splits: {', '.join(dd)})"
            )
        if "test" in dd:
            return dd
        n = dd["train"].num_rows
        if n < 2:
            raise DataError(
                f"hub dataset {dataset_id!r} has no 'test' split and too few rows ({n}) to hold one out"
            )
        perm = np.random.default_rng(0).permutation(n)
        n_test = _num_test_rows(n, test_fraction)
        train = dd["train"]
        return datasets.DatasetDict(
            {
                "train": train.select(np.sort(perm[n_test:])),
                "test": train.select(np.sort(perm[:n_test])),
            }
        )

    return preprocess


def _hub_columns(
    features, dataset_id: str, model: str, feature_column, label_column
) -> tuple[list[str], str | None]:
    """Resolve the feature and label column names of a hub split."""
    import datasets

    names = list(features)
    where = f"hub dataset {dataset_id!r}"
    if label_column is None:
        label_column = next((c for c in _HUB_LABEL_COLUMNS if c in features), None)
    elif label_column not in features:
        raise DataError(f"{where} has no label column {label_column!r}; columns: {', '.join(names)}")
    if model != "gaussian-mean" and label_column is None:
        raise DataError(
            f"{where} has no label column ({', '.join(_HUB_LABEL_COLUMNS)}); columns: "
            f"{', '.join(names)}; pass hub_label_column"
        )
    if feature_column is None:
        image = next((c for c in _HUB_IMAGE_COLUMNS if c in features), None)
        if image is not None:
            columns = [image]
        else:
            numeric = ("int", "uint", "float", "bool")
            columns = [
                c
                for c, f in features.items()
                if c != label_column
                and (
                    isinstance(f, datasets.ClassLabel)
                    or (isinstance(f, datasets.Value) and f.dtype.startswith(numeric))
                )
            ]
        if not columns:
            raise DataError(
                f"{where}: no image column ({', '.join(_HUB_IMAGE_COLUMNS)}) and no numeric "
                f"column; columns: {', '.join(names)}; pass hub_feature_column"
            )
    else:
        columns = [feature_column] if isinstance(feature_column, str) else list(feature_column)
        missing = [c for c in columns if c not in features]
        if missing or not columns:
            raise DataError(
                f"{where} has no feature column {', '.join(map(repr, missing)) or '(none given)'}; "
                f"columns: {', '.join(names)}"
            )
    return columns, (None if model == "gaussian-mean" else label_column)


def _scale_pixels(a: np.ndarray, column: str, where: str) -> np.ndarray:
    """Pixels to [0, 1]: 8-bit range / 255, 16-bit / 65535, floats unchanged."""
    if a.dtype.kind == "b" or a.dtype.kind == "f":
        return a.astype(np.float64)
    if a.dtype.kind not in "iu":
        raise DataError(f"{where}: image column {column!r} must be numeric, got dtype {a.dtype}")
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    if a.dtype == np.uint8 or (lo >= 0 and hi <= 255):
        return a / 255.0
    if a.dtype == np.uint16 or (lo >= 0 and hi <= 65535):
        return a / 65535.0
    raise DataError(f"{where}: image column {column!r} has pixel values outside 0..65535 ({lo}..{hi})")


def _hub_arrays(split, columns: list[str], label_column: str | None, where: str, model: str):
    """Features (float64 ``(n, d)``) and targets of one hub split."""
    import datasets

    data = split.select_columns(columns + ([label_column] if label_column else [])).with_format("numpy")[:]
    parts = []
    for column in columns:
        a = data[column]
        if a.dtype == object:  # ragged rows (e.g. images of different sizes)
            try:
                a = np.stack([np.asarray(v) for v in a])
            except ValueError:
                raise DataError(f"{where}: rows of column {column!r} have different shapes") from None
        is_image = isinstance(split.features[column], datasets.Image) or column in _HUB_IMAGE_COLUMNS
        if is_image:
            a = _scale_pixels(a, column, where)
        parts.append(_as_float_array(a.reshape(a.shape[0], -1), column, where))
    x = _as_x(np.concatenate(parts, axis=1), "+".join(columns), where)
    y = None if label_column is None else _as_y(data[label_column], label_column, where, model)
    return x, y


def _load_hub(
    name: str,
    model: str,
    *,
    test_fraction: float,
    hub_kwargs: dict | None,
    feature_column,
    label_column: str | None,
) -> Dataset:
    dataset_id = name[len(HUB_PREFIX):].strip()
    if not dataset_id:
        raise DataError(f"empty hub dataset name {name!r}; use {HUB_PREFIX}<dataset-id>, e.g. hub:mnist")
    kwargs = dict(hub_kwargs or {})
    reserved = [k for k in _HUB_RESERVED_KWARGS if k in kwargs]
    if reserved:
        raise DataError(f"hub_kwargs must not set {', '.join(reserved)} (set by load_dataset)")
    kwargs.setdefault("shuffle", False)
    try:
        from flwr_datasets import FederatedDataset
        from flwr_datasets.partitioner import IidPartitioner

        fds = FederatedDataset(
            dataset=dataset_id,
            partitioners={"train": IidPartitioner(num_partitions=1)},
            preprocessor=_hub_holdout(dataset_id, test_fraction),
            **kwargs,
        )
        train = fds.load_partition(0, "train")
        test = fds.load_split("test")
    except DataError:
        raise
    except Exception as exc:  # network, missing files, unknown id, bad kwargs
        raise DataError(
            f"could not load hub dataset {dataset_id!r}: {_one_line(exc)}; "
            "no network? use an embedded dataset or --data FILE.npz"
        ) from None
    where = f"hub dataset {dataset_id!r}"
    columns, label = _hub_columns(train.features, dataset_id, model, feature_column, label_column)
    for split_name, split in (("train", train), ("test", test)):
        missing = [c for c in columns + ([label] if label else []) if c not in split.features]
        if missing:
            raise DataError(f"{where}: split {split_name!r} lacks column(s) {', '.join(missing)}")
    x_train, y_train = _hub_arrays(train, columns, label, f"{where} (train)", model)
    x_test, y_test = _hub_arrays(test, columns, label, f"{where} (test)", model)
    if x_test.shape[1] != x_train.shape[1]:
        raise DataError(
            f"{where}: test rows have {x_test.shape[1]} features but train rows have {x_train.shape[1]}"
        )
    return Dataset(x_train, y_train, x_test, y_test, None, name)


def _as_float_array(arr: np.ndarray, key: str, where: str) -> np.ndarray:
    try:
        out = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{where}: key '{key}' must be numeric, got dtype {arr.dtype}") from None
    if not np.all(np.isfinite(out)):
        raise DataError(f"{where}: key '{key}' contains non-finite values (nan or inf)")
    return out


def _as_x(arr: np.ndarray, key: str, where: str) -> np.ndarray:
    x = _as_float_array(arr, key, where)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    if x.ndim != 2:
        raise DataError(f"{where}: key '{key}' must be 1-D or 2-D, got shape {x.shape}")
    if x.shape[0] == 0:
        raise DataError(f"{where}: key '{key}' has no rows")
    return _f64(x)


def _as_y(arr: np.ndarray, key: str, where: str, model: str) -> np.ndarray:
    y = _as_float_array(arr, key, where)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where}: key '{key}' must be 1-D, got shape {y.shape}")
    if model in _BINARY_MODELS:
        _check_labels(y[(y != 0) & (y != 1)], key, where, "0 or 1")
        return _i64(y)
    if model in _MULTICLASS_MODELS:
        _check_labels(y[(y < 0) | (y != np.floor(y))], key, where, "integers >= 0")
        return _i64(y)
    return _f64(y)


def _check_labels(bad: np.ndarray, key: str, where: str, rule: str) -> None:
    """Raise a DataError listing (up to 10 of) the distinct `bad` label values."""
    bad = np.unique(bad)
    if bad.size:
        shown = [int(v) if float(v).is_integer() else float(v) for v in bad[:10]]
        more = ", ..." if bad.size > 10 else ""
        raise DataError(f"{where}: key '{key}' labels must be {rule}, found {str(shown)[:-1]}{more}]")


def _load_npz(path: str, model: str, *, seed: int, test_fraction: float) -> Dataset:
    where = f"data file {path!r}"
    if not os.path.isfile(path):
        raise DataError(f"{where} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: np.asarray(npz[key]) for key in npz.files}
    except Exception as exc:  # any read failure is a data error
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where} is not a readable .npz file: {msg}") from None

    needs_y = model != "gaussian-mean"
    if "x_train" not in arrays:
        raise DataError(f"{where}: missing required key 'x_train'")
    x_train = _as_x(arrays["x_train"], "x_train", where)
    n, d = x_train.shape

    y_train = None
    if needs_y:
        if "y_train" not in arrays:
            raise DataError(f"{where}: key 'y_train' is required for model {model}")
        y_train = _as_y(arrays["y_train"], "y_train", where, model)
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
        client_id = _i64(cid)

    has_xt, has_yt = "x_test" in arrays, "y_test" in arrays
    if needs_y and has_xt != has_yt:
        given, missing = ("x_test", "y_test") if has_xt else ("y_test", "x_test")
        raise DataError(f"{where}: key '{given}' is given without '{missing}'")

    if has_xt:
        x_test = _as_x(arrays["x_test"], "x_test", where)
        if x_test.shape[1] != d:
            raise DataError(
                f"{where}: key 'x_test' has {x_test.shape[1]} features but 'x_train' has {d}"
            )
        y_test = None
        if needs_y:
            y_test = _as_y(arrays["y_test"], "y_test", where, model)
            if y_test.shape[0] != x_test.shape[0]:
                raise DataError(
                    f"{where}: key 'y_test' has {y_test.shape[0]} rows "
                    f"but 'x_test' has {x_test.shape[0]}"
                )
    else:
        if n < 2:
            raise DataError(f"{where}: key 'x_train' needs at least 2 rows to split off a test set")
        n_test = _num_test_rows(n, test_fraction)
        perm = np.random.default_rng(seed).permutation(n)
        test_rows, train_rows = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        x_test, x_train = _f64(x_train[test_rows]), _f64(x_train[train_rows])
        y_test = None
        if y_train is not None:
            y_test = np.ascontiguousarray(y_train[test_rows])
            y_train = np.ascontiguousarray(y_train[train_rows])
        if client_id is not None:
            client_id = _i64(client_id[train_rows])

    return Dataset(x_train, y_train, x_test, y_test, client_id, f"file:{os.path.basename(path)}")


# ----------------------------------------------------------------------- partitioning


def _partition_labels(dataset: Dataset, max_bins: int = _MAX_LABEL_BINS) -> np.ndarray:
    """Labels used by the label-based partition schemes.

    Classification targets (integer `y_train`) are used as they are. Continuous
    targets, or ``x_train[:, 0]`` when there are none, are cut into
    ``min(max_bins, n // 2)`` quantile bins and the bin number is the label.
    """
    y = dataset.y_train
    if y is not None and np.issubdtype(y.dtype, np.integer):
        return _i64(y)
    values = dataset.x_train[:, 0] if y is None else np.asarray(y, dtype=np.float64)
    n = values.shape[0]
    n_bins = max(1, min(max_bins, n // 2))
    edges = np.quantile(values, np.linspace(0.0, 1.0, n_bins + 1)[1:-1])
    bins = np.searchsorted(edges, values, side="right")
    # Renumber so labels are 0..B-1 even when tied quantiles merge bins.
    return _i64(np.unique(bins, return_inverse=True)[1])


def _hf_dataset(labels: np.ndarray):
    import datasets

    n = labels.shape[0]
    return datasets.Dataset.from_dict({"idx": np.arange(n, dtype=np.int64), "label": labels})


def _read_partitions(partitioner, ds, num_clients: int) -> list[np.ndarray]:
    partitioner.dataset = ds
    return [
        np.sort(np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64))
        for i in range(num_clients)
    ]


def _dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list:
    """Dirichlet label-skew split via ``flwr_datasets`` with deterministic restarts.

    ``DirichletPartitioner`` gives up after 11 draws that leave some client below
    ``min_partition_size``; for small `alpha` and many clients that is common, so
    fresh partitioners with seeds derived from `seed` are tried before failing.
    """
    from flwr_datasets.partitioner import DirichletPartitioner

    n = labels.shape[0]
    ds = _hf_dataset(labels)
    for attempt in range(_DIRICHLET_RESTARTS):
        sub_seed = (
            seed
            if attempt == 0
            else int(np.random.SeedSequence([seed, attempt]).generate_state(1)[0])
        )
        partitioner = DirichletPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            alpha=alpha,
            min_partition_size=1,
            self_balancing=False,
            shuffle=True,
            seed=sub_seed,
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parts = _read_partitions(partitioner, ds, num_clients)
        except ValueError:
            continue
        if all(p.size > 0 for p in parts):
            return parts
    raise DataError(
        f"dirichlet partition with alpha={alpha} left a client without data for "
        f"{n} training rows over {num_clients} clients; use a larger alpha or fewer clients"
    )


def _pathological(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int) -> list:
    from flwr_datasets.partitioner import PathologicalPartitioner

    n_classes = np.unique(labels).size
    if classes_per_client < 1:
        raise DataError(f"classes per client must be at least 1, got {classes_per_client}")
    if classes_per_client > n_classes:
        raise DataError(
            f"classes per client ({classes_per_client}) exceeds the number of distinct "
            f"labels ({n_classes})"
        )
    partitioner = PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=classes_per_client,
        class_assignment_mode="first-deterministic",
        shuffle=True,
        seed=seed,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parts = _read_partitions(partitioner, _hf_dataset(labels), num_clients)
    except ValueError:
        raise DataError(
            "pathological partition impossible: some label has fewer rows than the clients "
            "assigned to it; use fewer clients or fewer classes per client"
        ) from None
    covered = sum(p.size for p in parts)
    if covered != labels.shape[0]:
        raise DataError(
            f"pathological partition with {num_clients} clients x {classes_per_client} "
            f"classes leaves some of the {n_classes} labels unassigned "
            f"({labels.shape[0] - covered} rows unused); use more clients or more classes "
            f"per client"
        )
    for i, p in enumerate(parts):  # guaranteed by the partitioner; checked, as it is documented
        held = np.unique(labels[p]).size
        if p.size == 0 or held != classes_per_client:
            raise DataError(
                f"pathological partition gave client {i} {held} labels instead of "
                f"{classes_per_client}; use fewer clients or fewer classes per client"
            )
    return parts


def _natural(dataset: Dataset, num_clients: int) -> list:
    from flwr_datasets.partitioner import NaturalIdPartitioner

    if dataset.client_id is None:
        raise DataError("partition 'natural' needs a client_id array in the data file")
    n_ids = np.unique(dataset.client_id).size
    if n_ids != num_clients:
        raise DataError(
            f"partition 'natural': the data file has {n_ids} distinct client ids "
            f"but num_clients is {num_clients}"
        )
    partitioner = NaturalIdPartitioner(partition_by="label")
    return _read_partitions(partitioner, _hf_dataset(_i64(dataset.client_id)), num_clients)


def partition_indices(
    dataset: Dataset,
    num_clients: int,
    scheme: str,
    *,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
) -> list[np.ndarray]:
    """Split the training rows of a dataset over clients.

    The split is made by the ``flwr_datasets`` partitioners on a table of row
    indices and labels:

    * ``"iid"``: rows shuffled with `seed`, then cut in `num_clients` contiguous
      near-equal shards (``IidPartitioner``, which does not shuffle by itself).
    * ``"dirichlet"``: per label, client shares drawn from Dirichlet(`alpha`)
      (``DirichletPartitioner``); smaller `alpha` means more label skew. Every client
      gets at least one row.
    * ``"pathological"``: each client holds rows of exactly `classes_per_client`
      labels (``PathologicalPartitioner`` with ``class_assignment_mode=
      "first-deterministic"``: first class of client ``i`` is label ``i % L``, the
      others drawn with `seed`; the rows of a label are cut in near-equal contiguous
      chunks over the clients holding it). With ``num_clients >= L`` every row is used,
      e.g. McMahan et al.'s "2 classes per client" split of ``digits`` over 10 to 100
      clients. A split that leaves a label unused (possible when ``num_clients < L``)
      or needs a label on more clients than it has rows raises :class:`DataError`.
    * ``"natural"``: one client per distinct ``client_id`` value, ids mapped in sorted
      order to clients ``0..K-1`` (``NaturalIdPartitioner``).

    Labels for the label-based schemes are the classes for classification data. For
    continuous targets (regression), or no targets (gaussian-mean, where
    ``x_train[:, 0]`` is used), the values are cut into ``min(10, n // 2)`` quantile
    bins and the bin number serves as label; this is how non-IID splits of
    continuous data are made. For ``"pathological"`` the number of bins is further
    capped at `num_clients`, so that every bin is held by some client.

    Parameters
    ----------
    dataset : Dataset
        The dataset whose training rows are split.
    num_clients : int
        Number of clients, between 1 and the number of training rows.
    scheme : str
        One of :data:`PARTITIONS`.
    alpha : float, optional
        Dirichlet concentration for ``"dirichlet"``.
    classes_per_client : int, optional
        Labels per client for ``"pathological"``.
    seed : int, optional
        Seed; the result is a deterministic function of it.

    Returns
    -------
    list of numpy.ndarray
        `num_clients` int64 arrays of training-row indices, each sorted ascending and
        non-empty, together covering every training row exactly once.

    Raises
    ------
    DataError
        On an unknown scheme, a bad number of clients or parameters, or a split that
        cannot be made.
    """
    if scheme not in PARTITIONS:
        raise DataError(f"unknown partition {scheme!r}; known partitions: {', '.join(PARTITIONS)}")
    n = dataset.x_train.shape[0]
    num_clients = int(num_clients)
    if num_clients < 1:
        raise DataError(f"number of clients must be at least 1, got {num_clients}")
    if num_clients > n:
        raise DataError(f"cannot split {n} training rows over {num_clients} clients")
    if scheme == "natural":
        return _natural(dataset, num_clients)
    if scheme == "iid":
        from flwr_datasets.partitioner import IidPartitioner

        ds = _hf_dataset(np.zeros(n, dtype=np.int64)).shuffle(seed=seed)
        return _read_partitions(IidPartitioner(num_partitions=num_clients), ds, num_clients)
    if scheme == "dirichlet":
        labels = _partition_labels(dataset)
        alpha = float(alpha)
        if not (np.isfinite(alpha) and alpha > 0):
            raise DataError(f"dirichlet alpha must be a positive number, got {alpha}")
        return _dirichlet(labels, num_clients, alpha, seed)
    # Binned continuous labels: at most one bin per client, so every bin gets a client.
    labels = _partition_labels(dataset, max_bins=min(_MAX_LABEL_BINS, num_clients))
    return _pathological(labels, num_clients, int(classes_per_client), seed)
