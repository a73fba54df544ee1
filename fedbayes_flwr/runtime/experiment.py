"""An experiment: data, partitions, model, prior and the algorithm's bundle from a RunConfig.

:func:`build_experiment` is called identically by the in-process engine, by Flower's ServerApp
(for the prior and the test set) and by each ClientApp (for its partition), so every engine sees
the same data. It is cached: ClientApps call it for every message.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, ClientData, Setup
from fedbayes_flwr.data import DataError, Dataset, load_dataset, partition_indices
from fedbayes_flwr.data.base import as_x, as_y
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.models import Model, load_model_modules, make_model, model_spec, parse_hidden
from fedbayes_flwr.runtime.config import RunConfig, section_items
from fedbayes_flwr.runtime.memory import check_memory


class Experiment(NamedTuple):
    config: RunConfig
    dataset: Dataset
    partitions: tuple[np.ndarray, ...]
    model: Model
    prior: NaturalGaussian
    bundle: Bundle
    setup: Setup
    actions: Mapping[str, ActionSpec]

    @property
    def num_clients(self) -> int:
        return len(self.partitions)

    def client_data(self, partition_id: int) -> ClientData:
        """Training rows of ``partition_id``."""
        if not 0 <= partition_id < self.num_clients:
            raise ValueError(f"partition id {partition_id} outside 0..{self.num_clients - 1}")
        idx = self.partitions[partition_id]
        y = self.dataset.y_train
        return ClientData(self.dataset.x_train[idx], None if y is None else y[idx])


@functools.lru_cache(maxsize=8)
def build_experiment(config: RunConfig) -> Experiment:
    """Load data, split it, make the model, prior and the bundle's :class:`Setup`.

    One client (``num-clients = 1``, e.g. ``global-vi``) holds every training row in order.
    """
    registry.load_modules(config.algorithm_modules)
    load_model_modules(config.model_modules)
    registry.get(config.algorithm)  # an unknown name fails before any data is loaded
    cls = model_spec(config.model)
    dataset = load_dataset(config.dataset, cls.target, synthetic=cls.synthetic, seed=config.seed,
                           test_fraction=config.test_fraction, data_file=config.data,
                           synthetic_size=config.synthetic_size,
                           synthetic_dim=config.synthetic_dim, noise_scale=config.noise_scale)
    partitions: tuple[np.ndarray, ...]
    if config.num_clients == 1:
        partitions = (np.arange(dataset.x_train.shape[0]),)
    else:
        partitions = tuple(partition_indices(
            dataset, config.num_clients, config.partition, alpha=config.partition_alpha,
            classes_per_client=config.partition_classes, seed=config.seed))
    check_partitions = getattr(config.section, "validate_partitions", None)  # data-time checks
    if check_partitions is not None:
        check_partitions([len(p) for p in partitions])
    exp = assemble(config, dataset, partitions, num_classes(dataset))
    check = getattr(exp.model, "check_data", None)  # structured models: e.g. LDA needs counts
    reason = check(dataset.x_train) if check else None
    if reason:
        raise DataError(f"dataset {dataset.name!r}: {reason}")
    return exp


def check_memory_early(config: RunConfig, num_features: int) -> None:
    """The memory guard before the data are loaded (the CLI's cheap checks, no TensorFlow):
    the bundle's estimate for ``num-clients`` partitions of ``num_features`` columns, with a
    two-class model (a lower bound for more classes); raises ConfigError."""
    registry.load_modules(config.algorithm_modules)
    load_model_modules(config.model_modules)
    bundle = registry.get(config.algorithm).bundle
    if bundle.memory_estimate is None:
        return
    model = make_model(config.model, config.noise_scale, parse_hidden(config.hidden_layers), 2)
    check_memory(bundle, Setup(model, None, config.num_clients, num_features, config.seed,
                               config.section))


def assemble(config: RunConfig, dataset: Dataset, partitions: tuple[np.ndarray, ...],
             classes: int) -> Experiment:
    """The model, prior and :class:`Setup` of ``config`` over loaded, partitioned data (a
    node's cached partition too: :mod:`fedbayes_flwr.runtime.partition_cache`)."""
    bundle = registry.get(config.algorithm).bundle
    model = make_model(config.model, config.noise_scale, parse_hidden(config.hidden_layers),
                       classes)
    check = getattr(model, "check_classes", None)  # a user's network: its output width
    if check is not None:
        check(classes)
    num_features = dataset.x_train.shape[1]
    # the memory guard, before the prior (a full d x d covariance) or any state is allocated
    check_memory(bundle, Setup(model, None, len(partitions), num_features, config.seed,
                               config.section))
    diag = bundle.prior_diag(config.section, model)
    prior = model.prior(num_features, config.prior_scale, diag)
    setup = Setup(model, prior, len(partitions), num_features, config.seed, config.section)
    check = getattr(config.section, "validate_setup", None)  # checks that need the dimension
    if check is not None:
        check(setup)
    return Experiment(config, dataset, partitions, model, prior, bundle, setup,
                      bundle.actions(setup))


def num_classes(dataset: Dataset) -> int:
    """Number of classes of integer-labelled data (1 for regression / no labels).

    Labels number the classes ``0..K-1``. More classes than labelled rows (train and test),
    i.e. classes with no example anywhere, is a labelling mistake (a missing-value code such as
    999999 among the labels) and raises :class:`DataError` instead of building a model with
    ``K`` outputs (gigabytes of parameters, or a MemoryError)."""
    y = dataset.y_train
    if y is None or not np.issubdtype(y.dtype, np.integer):
        return 1
    classes = int(max(y.max(), dataset.y_test.max() if dataset.y_test is not None else 0)) + 1
    rows = y.size + (0 if dataset.y_test is None else dataset.y_test.size)
    if classes > max(rows, 2):
        raise DataError(f"dataset {dataset.name!r}: labels run up to {classes - 1}, i.e. "
                        f"{classes} classes for {rows} labelled rows; class labels must number "
                        f"the classes 0..K-1")
    return classes


# Keys a node may set for itself (its own data file, its own speed, where the server writes) and
# keys only the server reads: never compared between server and clients.
NODE_LOCAL_KEYS = ("data", "client-delay", "output-dir")
# A request carries the server's fingerprint under this ConfigRecord prefix; a client whose own
# differs fails with a message starting with MISMATCH (the strategy stops the run on it).
EXPECT, MISMATCH = "expect.", "experiment mismatch"
SERVER_ONLY_KEYS = ("eval-every", "max-seconds", "max-retries", "node-timeout", "round-timeout",
                    "resume", "deployment-nodes")


def fingerprint(bundle_name: str, setup: Setup, run_config: dict | None = None) -> dict:
    """The settings that define an experiment, which server and clients must share.

    Always the bundle, the number of partitions, the parameter dimension, the run seed and the
    bundle's config section; plus every key of ``run_config`` (a kebab-case run config) except
    :data:`NODE_LOCAL_KEYS` and :data:`SERVER_ONLY_KEYS`.
    """
    out = {"bundle": bundle_name, "num-clients": int(setup.num_clients),
           "param-dim": int(setup.prior.dim), "seed": int(setup.run_seed)}
    out.update({f"{bundle_name}.{k}": v for k, v in section_items(setup.config).items()})
    for key, value in (run_config or {}).items():
        if key not in NODE_LOCAL_KEYS and key not in SERVER_ONLY_KEYS and key not in out:
            out[key] = value
    return out


def mismatches(expected: dict, actual: dict) -> list[str]:
    """``"key: server X, this client Y"`` for every key of ``expected`` that differs."""
    return [f"{k}: server {expected[k]!r}, this client {actual.get(k, '<unset>')!r}"
            for k in sorted(expected) if actual.get(k) != expected[k]]


# ------------------------------------------------------------------ experiments from arrays
APP_DATA = "app-data"
"""The dataset name recorded for data given as arrays (``load_data`` / ``test_data`` of the
Flower apps, :func:`node_experiment` and :func:`server_experiment`)."""
ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")


def as_arrays(data, where: str) -> dict:
    """``(x, y)``, ``(x,)`` or a dict with keys of :data:`ARRAY_KEYS` as a dict of arrays.

    Raises
    ------
    DataError
        Neither form, or a dict with unknown keys or without ``x_train``.
    """
    if isinstance(data, Mapping):
        unknown = sorted(set(map(str, data)) - set(ARRAY_KEYS))
        if unknown or "x_train" not in data:
            raise DataError(f"{where}: a dict needs 'x_train' and may hold {', '.join(ARRAY_KEYS)}"
                            f"{'; unknown: ' + ', '.join(unknown) if unknown else ''}")
        return {str(k): v for k, v in data.items() if v is not None}
    if isinstance(data, tuple | list) and len(data) in (1, 2):
        return {"x_train": data[0], **({"y_train": data[1]} if len(data) == 2 else {})}
    raise DataError(f"{where}: expected (x, y) or a dict of arrays ({', '.join(ARRAY_KEYS)}), "
                    f"got {type(data).__name__}")


def _xy(x, y, target: str, key: str, where: str) -> tuple[np.ndarray, np.ndarray | None]:
    x = as_x(np.asarray(x), f"x_{key}", where)
    if target == "none":
        return x, None
    if y is None:
        raise DataError(f"{where}: this model needs targets ('y_{key}')")
    y = as_y(np.asarray(y), f"y_{key}", where, target)
    if y.shape[0] != x.shape[0]:
        raise DataError(f"{where}: 'y_{key}' has {y.shape[0]} rows but 'x_{key}' has "
                        f"{x.shape[0]}")
    return x, y


def node_experiment(config: RunConfig, partition_id: int, data,
                    classes: int | None = None) -> Experiment:
    """The experiment of ``config`` as node ``partition_id`` sees it, over its own arrays.

    Parameters
    ----------
    config : RunConfig
        The run config both apps share (its ``num-clients`` partitions; its ``dataset`` key is
        not read).
    partition_id : int
        This node's partition, in ``0..num-clients-1``.
    data : tuple or dict
        ``(x, y)`` (``(x,)`` for a model without targets) or a dict with ``x_train``,
        ``y_train`` and optional ``x_test``, ``y_test`` (a node trains on ``x_train`` only).
    classes : int, optional
        Number of classes of a multi-class model; default: from this node's labels (give it
        when a node may miss a class, else its parameter dimension differs from the server's).

    Returns
    -------
    Experiment
        This partition holds every row of ``data``; the other partitions and the test set are
        empty. Model, prior and :class:`Setup` are those of :func:`server_experiment` with the
        same ``config``, dimension and ``classes``.
    """
    if not 0 <= partition_id < config.num_clients:
        raise ValueError(f"partition id {partition_id} outside 0..{config.num_clients - 1} "
                         f"(num-clients {config.num_clients})")
    arrays = as_arrays(data, f"load_data of partition {partition_id}")
    target = model_spec(config.model).target
    x, y = _xy(arrays["x_train"], arrays.get("y_train"), target, "train",
               f"load_data of partition {partition_id}")
    dataset = Dataset(x, y, x[:0], None if y is None else y[:0], None, APP_DATA)
    rows = np.arange(x.shape[0])
    partitions = tuple(rows if k == partition_id else rows[:0] for k in range(config.num_clients))
    return assemble(config, dataset, partitions, classes or _classes(y))


def _classes(*labels) -> int:
    """Classes of integer labels seen in ``labels`` (1 for real targets or no labels)."""
    seen = [y for y in labels if y is not None and y.size and np.issubdtype(y.dtype, np.integer)]
    return max(int(y.max()) + 1 for y in seen) if seen else 1


def server_experiment(config: RunConfig, num_features: int, test=None,
                      classes: int | None = None) -> Experiment:
    """The experiment of ``config`` as a server over nodes' own data needs it.

    Parameters
    ----------
    config : RunConfig
        The run config both apps share.
    num_features : int
        Columns of every node's ``x`` (the parameter dimension follows from it).
    test : tuple or dict, optional
        The test set, ``(x, y)`` or a dict with ``x_test`` / ``y_test`` (or ``x_train`` /
        ``y_train``); without it the history rows carry no test metrics.
    classes : int, optional
        Number of classes of a multi-class model; default: from the test labels.

    Returns
    -------
    Experiment
        No training rows (``num-clients`` empty partitions), the test set, and the model, prior
        and :class:`Setup` every node builds with :func:`node_experiment`.
    """
    target = model_spec(config.model).target
    x = np.zeros((0, int(num_features)))
    y = None if target == "none" else np.zeros(0, np.float64 if target == "real" else np.int64)
    x_test, y_test = x, y
    if test is not None:
        if isinstance(test, Mapping) and "x_test" in test:
            test = {"x_train": test["x_test"], "y_train": test.get("y_test")}
        arrays = as_arrays(test, "test_data")
        x_test, y_test = _xy(arrays["x_train"], arrays.get("y_train"), target, "test",
                             "test_data")
        if x_test.shape[1] != num_features:
            raise DataError(f"test_data has {x_test.shape[1]} features, num_features is "
                            f"{num_features}")
    dataset = Dataset(x, y, x_test, y_test, None, APP_DATA)
    partitions = tuple(np.arange(0) for _ in range(config.num_clients))
    return assemble(config, dataset, partitions, classes or _classes(y_test))
