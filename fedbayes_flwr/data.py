"""Datasets and client partitions for the federated Bayesian experiments.

Two public entry points:

* :func:`load_dataset` returns a :class:`Dataset` (train/test arrays) from one of the
  embedded sets (:data:`DATASETS`) or from a user ``.npz`` file.
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
    "DataError",
    "Dataset",
    "load_dataset",
    "partition_indices",
]

DATASETS = ("breast-cancer", "diabetes", "synthetic")
"""Names of the embedded datasets accepted by :func:`load_dataset`."""

PARTITIONS = ("iid", "dirichlet", "pathological", "natural")
"""Names of the partition schemes accepted by :func:`partition_indices`."""


_MAX_LABEL_BINS = 10
_DIRICHLET_RESTARTS = 50


class DataError(ValueError):
    """Bad user data or data configuration; the message is one line saying what is wrong."""


class Dataset(NamedTuple):
    """A train/test dataset.

    Attributes
    ----------
    x_train : numpy.ndarray
        Training inputs, float64 of shape ``(n, d)``.
    y_train : numpy.ndarray or None
        Training targets: float64 ``(n,)`` for regression, int64 ``(n,)`` in {0, 1}
        for classification, ``None`` for the gaussian-mean model.
    x_test : numpy.ndarray
        Test inputs, float64 of shape ``(m, d)`` with ``m >= 1``.
    y_test : numpy.ndarray or None
        Test targets, same conventions as `y_train`.
    client_id : numpy.ndarray or None
        int64 ``(n,)`` natural client id of each training row, or ``None``.
    name : str
        Dataset name (``"file:<basename>"`` for user files).
    """

    x_train: np.ndarray
    y_train: np.ndarray | None
    x_test: np.ndarray
    y_test: np.ndarray | None
    client_id: np.ndarray | None
    name: str


# --------------------------------------------------------------------------- loading


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
) -> Dataset:
    """Load an embedded dataset or a user ``.npz`` file for a model.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`. Ignored when `data_file` is given.
    model : str
        One of ``"gaussian-mean"``, ``"linear-regression"``, ``"logistic-regression"``.
    seed : int, optional
        Seed for synthetic data and for the test split of user files. The embedded
        real datasets use a fixed split (``random_state=0``) independent of `seed`,
        so results are comparable across seeds.
    test_fraction : float, optional
        Fraction of rows held out as test set, in (0, 1). Not used when the data
        file supplies ``x_test``.
    data_file : str, optional
        Path of a ``.npz`` file with keys ``x_train`` (required), ``y_train``,
        ``x_test``, ``y_test`` and ``client_id`` (optional). User data is not
        standardised.
    synthetic_size : int, optional
        Total number of rows (train plus test) of the synthetic dataset.
    synthetic_dim : int, optional
        Input dimension of the synthetic dataset.
    noise_scale : float, optional
        Observation noise standard deviation of the synthetic gaussian-mean and
        linear-regression data.

    Returns
    -------
    Dataset
        Float arrays are float64 and C-contiguous.

    Raises
    ------
    DataError
        On an unknown model or dataset, a dataset that does not fit the model, bad
        parameters or an invalid data file.
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
    if name == "synthetic":
        return _make_synthetic(
            model,
            seed=seed,
            test_fraction=test_fraction,
            size=synthetic_size,
            dim=synthetic_dim,
            noise_scale=noise_scale,
        )
    raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")


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

    if model != "logistic-regression":
        raise DataError(
            "dataset 'breast-cancer' is a binary classification set; "
            "use --model logistic-regression"
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

    if model != "linear-regression":
        raise DataError("dataset 'diabetes' is a regression set; use --model linear-regression")
    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=0)
    x_tr, x_te = _standardise(x_tr, x_te)
    y_tr, y_te = _standardise(y_tr, y_te)
    return Dataset(x_tr, y_tr, x_te, y_te, None, "diabetes")


def _num_test_rows(n: int, test_fraction: float) -> int:
    """Number of test rows: ``round(test_fraction * n)``, at least 1 on each side."""
    return int(min(max(1, round(test_fraction * n)), n - 1))


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
    else:
        x = rng.standard_normal((size, dim))
        w = rng.standard_normal(dim)
        b = rng.standard_normal()
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        y = _i64(rng.random(size) < p)
    x = _f64(x)
    return Dataset(
        _f64(x[:n_train]),
        None if y is None else np.ascontiguousarray(y[:n_train]),
        _f64(x[n_train:]),
        None if y is None else np.ascontiguousarray(y[n_train:]),
        None,
        "synthetic",
    )


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
    if model == "logistic-regression":
        bad = np.unique(y[(y != 0) & (y != 1)])
        if bad.size:
            shown = [int(v) if float(v).is_integer() else float(v) for v in bad[:10]]
            more = ", ..." if bad.size > 10 else ""
            raise DataError(
                f"{where}: key '{key}' labels must be 0 or 1, found {str(shown)[:-1]}{more}]"
            )
        return _i64(y)
    return _f64(y)


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
      labels (``PathologicalPartitioner``, first class of client ``i`` is label
      ``i % L``, the others random).
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
