"""The ClientApp: one app serving every registered algorithm, routed by message type.

* ``query.partition``: report this node's ``partition-id`` (node config).
* ``train.<bundle>`` / ``evaluate.<bundle>`` / ``query.<bundle>``: the generic handler
  (:func:`clients.handler.handle`) for every bundle in the registry, including bundles of plugin
  modules named in ``algorithm-modules`` (imported from the run config before routing, so a plugin
  registered in the CLI also reaches Ray actors and deployed nodes); the model plugins of
  ``model-modules`` are imported the same way.

``app`` reads its settings from Flower's run config (``flwr run``); :func:`make_client_app` bakes
explicit settings in, for ``flwr.simulation.run_simulation`` whose run config is empty, and may
give the node its own data (``load_data``) and a model object (``model``), for an app that uses
none of the project's datasets: see :func:`make_client_app`.

Node config (``flower-supernode --node-config``): ``partition-id``, ``num-partitions``, and the
node-local ``data`` (its own data file), ``client-delay`` and ``cache-dir`` (a directory where the
node keeps its prepared partition between messages: :mod:`fedbayes_flwr.runtime.partition_cache`; a
deployed ClientApp is a new process per message). With ``FEDBAYES_TIMING_LOG`` set in the
SuperNode's environment, each message appends one JSON line of timestamps there (process start,
app import, data ready, reply ready: ``benchmarks/flower/deployment_split.py``).
"""

# ruff: noqa: E402  (the imports follow _IMPORT_START on purpose: their cost is measured)
from __future__ import annotations

import time

_IMPORT_START = time.time()

import json
import os
import sys
import uuid
from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.algorithms.base import CATEGORIES
from fedbayes_flwr.models import Model, load_model_modules, register_object
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import Experiment, build_experiment, node_experiment

from .handler import handle


def _partition_id(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ValueError("node config lacks 'partition-id' (start the SuperNode with "
                         "--node-config \"partition-id=K num-partitions=M\")")
    return int(context.node_config["partition-id"])


class BundleClientApp(ClientApp):
    """A ClientApp that registers a handler for every bundle the registry knows, loading the
    run's plugin modules first."""

    def __init__(self, overrides: dict | None = None, *, model: Model | str | None = None,
                 load_data: Callable[[Context], object] | None = None,
                 num_classes: int | None = None):
        super().__init__()
        self.overrides = dict(overrides or {})
        self.user_model = model
        if model is not None:  # a Model object: registered here, again in each process
            self.overrides["model"] = register_object(model)
        self.load_data, self.num_classes = load_data, num_classes
        self._token = uuid.uuid4().hex  # this app's node data in the process cache
        if self.overrides:  # an unknown key fails here, naming it
            parse_run_config(self.overrides)
        self.query("partition")(self._partition)
        self._register()

    def _values(self, context: Context) -> dict:
        return {**dict(context.run_config), **self.overrides}

    def experiment(self, context: Context, partition_id: int | None = None) -> Experiment:
        if isinstance(self.user_model, Model):  # a fresh process (a Ray actor, a deployed message)
            register_object(self.user_model, self.overrides["model"])
        config = parse_run_config(self._values(context))
        if self.load_data is not None:
            if partition_id is None:
                partition_id = _partition_id(context)
            key = (self._token, config, partition_id)
            if key not in _NODE_DATA:  # load_data once per process and partition
                while len(_NODE_DATA) >= 8:
                    _NODE_DATA.pop(next(iter(_NODE_DATA)))
                _NODE_DATA[key] = node_experiment(config, partition_id, self.load_data(context),
                                                  self.num_classes)
            return _NODE_DATA[key]
        # Node-local data path (deployment): a SuperNode may point at its own file.
        if "data" in context.node_config:
            config = config.replace(data=str(context.node_config["data"]))
        if "client-delay" in context.node_config:  # a real device's own simulated slowness
            config = config.replace(client_delay=float(context.node_config["client-delay"]))
        cache_dir = str(context.node_config.get("cache-dir", ""))
        if cache_dir and partition_id is not None:  # prepared once per node, then loaded
            from fedbayes_flwr.runtime.partition_cache import client_experiment

            return client_experiment(config, partition_id, os.path.expanduser(cache_dir))
        return build_experiment(config)

    @staticmethod
    def _partition(message: Message, context: Context) -> Message:
        """This node's ``partition-id`` and, when its node config has it, ``num-partitions``
        (the server fails fast when they cannot cover its partitions)."""
        record = {"partition-id": _partition_id(context)}
        if "num-partitions" in context.node_config:
            record["num-partitions"] = int(context.node_config["num-partitions"])
        return Message(RecordDict({"config": ConfigRecord(record)}), reply_to=message)

    def _handler(self, message: Message, context: Context) -> Message:
        start = time.time()
        partition_id = _partition_id(context)
        exp = self.experiment(context, partition_id)
        ready = time.time()
        reply = handle(exp, partition_id, message, context)
        if os.environ.get(TIMING_LOG):
            _log_timing(message, partition_id, getattr(self, "_call_start", start), start, ready)
        return reply

    def _register(self) -> None:
        for name in registry.bundles():
            for category in CATEGORIES:
                if f"{category}.{name}" not in self._registered_funcs:
                    getattr(self, category)(name)(self._handler)

    def __call__(self, message: Message, context: Context) -> Message:
        self._call_start = time.time()
        values = self._values(context)
        registry.load_modules(str(values.get("algorithm-modules", "")))
        load_model_modules(str(values.get("model-modules", "")))
        self._register()
        return super().__call__(message, context)


TIMING_LOG = "FEDBAYES_TIMING_LOG"
# (app, run config, partition) -> the node's experiment over its load_data arrays
_NODE_DATA: dict[tuple, Experiment] = {}


def _process_start() -> float | None:
    """This process's start time (Linux ``/proc``), seconds since the epoch."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _log_timing(message: Message, partition_id: int, call: float, start: float,
                ready: float) -> None:
    """Append this message's timestamps to ``$FEDBAYES_TIMING_LOG`` (one JSON line)."""
    envelope = message.content.config_records.get("config") or {}
    row = {"pid": os.getpid(), "partition": partition_id, "type": message.metadata.message_type,
           "action": str(envelope.get("action", "")), "round": int(envelope.get("round", 0)),
           "process_start": _process_start(), "import_start": _IMPORT_START,
           "import_end": _IMPORT_END, "call_start": call, "handler_start": start, "data_ready": ready,
           "reply_ready": time.time(), "tensorflow": "tensorflow" in sys.modules}
    with open(os.environ[TIMING_LOG], "a") as f:
        f.write(json.dumps(row) + "\n")


def make_client_app(overrides: dict | None = None, *, model: Model | str | None = None,
                    load_data: Callable[[Context], object] | None = None,
                    num_classes: int | None = None) -> ClientApp:
    """A ClientApp whose run config is ``context.run_config`` updated by ``overrides``.

    Parameters
    ----------
    overrides : dict, optional
        Run-config keys (``num-clients``, ``algorithm``, the algorithm's section...): give the
        server (:func:`strategies.make_server_app`) the same ones, else the first request fails
        with the differing keys (``experiment mismatch``).
    model : str or fedbayes_flwr.models.Model, optional
        A registered model name, or a model object: registered in every process the app runs
        in under :func:`fedbayes_flwr.models.stable_name` (the server app computes the same
        name from an equal object).
    load_data : callable, optional
        ``load_data(context) -> (x, y)`` or a dict of arrays (``x_train``, ``y_train``, optional
        ``x_test``, ``y_test``; a node trains on ``x_train`` only): this node's own data (a
        device's storage in deployment; in simulation, e.g. the partition
        ``context.node_config["partition-id"]`` of a dataset). Called once per process and
        partition (a deployed ClientApp is a new process per message: every message). Without
        it the node builds its partition of the run config's ``dataset`` / ``data``.
    num_classes : int, optional
        Classes of a multi-class model (default: from the node's labels; give it when a node
        may miss a class). The server needs the same.

    Returns
    -------
    ClientApp
        Answers ``query.partition`` with the node's ``partition-id`` (node config) and every
        bundle's requests (:func:`clients.handle`).
    """
    return BundleClientApp(overrides, model=model, load_data=load_data, num_classes=num_classes)


app = make_client_app()
_IMPORT_END = time.time()
