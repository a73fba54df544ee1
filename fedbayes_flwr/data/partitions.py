"""Client partitions of a dataset's training rows, made by the ``flwr_datasets`` partitioners.

``flwr_datasets`` and ``datasets`` are imported lazily, when a split is made.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedbayes_flwr.data.base import DataError, Dataset, i64

__all__ = ["PARTITIONS", "partition_indices"]

PARTITIONS = ("iid", "dirichlet", "pathological", "natural")
"""Names of the partition schemes accepted by :func:`partition_indices`."""

_MAX_LABEL_BINS = 10
_DIRICHLET_RESTARTS = 50


def _partition_labels(dataset: Dataset, max_bins: int = _MAX_LABEL_BINS) -> np.ndarray:
    """Labels used by the label-based partition schemes.

    Classification targets (integer `y_train`) are used as they are. Continuous
    targets, or ``x_train[:, 0]`` when there are none, are cut into
    ``min(max_bins, n // 2)`` quantile bins and the bin number is the label.
    """
    y = dataset.y_train
    if y is not None and np.issubdtype(y.dtype, np.integer):
        return i64(y)
    values = dataset.x_train[:, 0] if y is None else np.asarray(y, dtype=np.float64)
    n = values.shape[0]
    n_bins = max(1, min(max_bins, n // 2))
    edges = np.quantile(values, np.linspace(0.0, 1.0, n_bins + 1)[1:-1])
    bins = np.searchsorted(edges, values, side="right")
    # Renumber so labels are 0..B-1 even when tied quantiles merge bins.
    return i64(np.unique(bins, return_inverse=True)[1])


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
    return _read_partitions(partitioner, _hf_dataset(i64(dataset.client_id)), num_clients)


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
