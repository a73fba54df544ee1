"""A node-local cache of one client's prepared partition, for processes that live one message.

A deployed Flower ClientApp runs in a new process for every message (flwr 1.42), so the in-memory
cache of :func:`fedbayes_flwr.runtime.experiment.build_experiment` never hits there: every message would
load the dataset, split it for all clients (importing ``flwr_datasets`` for a Dirichlet split:
~2 s) and keep one partition. :func:`client_experiment` does that once per node and experiment,
stores the partition's rows in ``<cache-dir>/<key>.npz`` (written atomically), and afterwards
loads only those rows. The key hashes every run-config key that can change the data (everything
but the keys of :data:`IGNORED_KEYS`) with the data file's size and modification time and
:data:`FORMAT`, so a changed experiment or file never reads a stale partition.

The :class:`~fedbayes_flwr.runtime.experiment.Experiment` it returns holds only this partition's training
rows (the other partitions are empty, the test set has no rows): what a client needs, and the same
model, prior and :class:`~fedbayes_flwr.algorithms.base.Setup` as the full experiment.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile

import numpy as np

from fedbayes_flwr.data import Dataset
from fedbayes_flwr.runtime.config import RunConfig
from fedbayes_flwr.runtime.experiment import (
    SERVER_ONLY_KEYS,
    Experiment,
    assemble,
    build_experiment,
    num_classes,
)

FORMAT = 1  # bump when the stored arrays change meaning
# Keys that never change a client's data (and change often between otherwise equal runs).
IGNORED_KEYS = ("output-dir", "client-delay", "stragglers", "straggler-factor", "inject-fault",
                *SERVER_ONLY_KEYS)


def cache_key(config: RunConfig, partition_id: int) -> str:
    """Hex digest naming partition ``partition_id`` of ``config``'s data."""
    keys = {k: v for k, v in config.to_run_config().items() if k not in IGNORED_KEYS}
    if config.data:
        stat = os.stat(config.data)
        keys["data-file"] = [stat.st_size, stat.st_mtime_ns]
    keys.update({"cache-format": FORMAT, "cache-partition-id": partition_id})
    text = json.dumps(keys, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _store(path: str, exp: Experiment, partition_id: int) -> None:
    data = exp.client_data(partition_id)
    arrays = {"x": data.x, "num_classes": np.int64(num_classes(exp.dataset)),
              "num_partitions": np.int64(exp.num_clients), "name": np.str_(exp.dataset.name)}
    if data.y is not None:
        arrays["y"] = data.y
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _load(path: str, config: RunConfig, partition_id: int) -> Experiment:
    with np.load(path, allow_pickle=False) as f:
        x, y = f["x"], (f["y"] if "y" in f.files else None)
        classes, count, name = int(f["num_classes"]), int(f["num_partitions"]), str(f["name"])
    dataset = Dataset(x, y, x[:0], None if y is None else y[:0], None, name)
    rows = np.arange(x.shape[0])
    partitions = tuple(rows if k == partition_id else rows[:0] for k in range(count))
    return assemble(config, dataset, partitions, classes)


@functools.lru_cache(maxsize=8)
def client_experiment(config: RunConfig, partition_id: int, cache_dir: str) -> Experiment:
    """The experiment of ``config`` as partition ``partition_id`` needs it, through the cache
    in ``cache_dir`` (built and stored on a miss; an unreadable entry is rebuilt)."""
    path = os.path.join(cache_dir, f"{cache_key(config, partition_id)}.npz")
    if os.path.exists(path):
        try:
            return _load(path, config, partition_id)
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry: rebuild it below
    exp = build_experiment(config)
    exp.client_data(partition_id)  # an out-of-range partition id fails here, naming it
    _store(path, exp, partition_id)
    return exp
