"""The ClientApp: one app serving every registered algorithm, routed by message type.

* ``query.partition``: report this node's ``partition-id`` (node config).
* ``train.<bundle>`` / ``evaluate.<bundle>`` / ``query.<bundle>``: the generic handler
  (:func:`clients.handler.handle`) for every bundle in the registry, including bundles of plugin
  modules named in ``algorithm-modules`` (imported from the run config before routing, so a plugin
  registered in the CLI also reaches Ray actors and deployed nodes).

``app`` reads its settings from Flower's run config (``flwr run``); :func:`make_client_app` bakes
explicit settings in, for ``flwr.simulation.run_simulation`` whose run config is empty.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.algorithms.base import CATEGORIES
from fedbayes_flwr.config import parse_run_config
from fedbayes_flwr.experiment import Experiment, build_experiment

from .handler import handle


def _partition_id(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ValueError("node config lacks 'partition-id' (start the SuperNode with "
                         "--node-config \"partition-id=K num-partitions=M\")")
    return int(context.node_config["partition-id"])


class BundleClientApp(ClientApp):
    """A ClientApp that registers a handler for every bundle the registry knows, loading the
    run's plugin modules first."""

    def __init__(self, overrides: dict | None = None):
        super().__init__()
        self.overrides = dict(overrides or {})
        if self.overrides:  # an unknown key fails here, naming it
            parse_run_config(self.overrides)
        self.query("partition")(self._partition)
        self._register()

    def _values(self, context: Context) -> dict:
        return {**dict(context.run_config), **self.overrides}

    def experiment(self, context: Context) -> Experiment:
        config = parse_run_config(self._values(context))
        # Node-local data path (deployment): a SuperNode may point at its own file.
        if "data" in context.node_config:
            config = config.replace(data=str(context.node_config["data"]))
        if "client-delay" in context.node_config:  # a real device's own simulated slowness
            config = config.replace(client_delay=float(context.node_config["client-delay"]))
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
        return handle(self.experiment(context), _partition_id(context), message, context)

    def _register(self) -> None:
        for name in registry.bundles():
            for category in CATEGORIES:
                if f"{category}.{name}" not in self._registered_funcs:
                    getattr(self, category)(name)(self._handler)

    def __call__(self, message: Message, context: Context) -> Message:
        registry.load_modules(str(self._values(context).get("algorithm-modules", "")))
        self._register()
        return super().__call__(message, context)


def make_client_app(overrides: dict | None = None) -> ClientApp:
    """A ClientApp whose run config is ``context.run_config`` updated by ``overrides``."""
    return BundleClientApp(overrides)


app = make_client_app()
