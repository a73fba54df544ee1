"""The ClientApp: one app serving every algorithm, routed by message type.

* ``query.partition``: report this node's ``partition-id`` (node config).
* ``train.pvi`` / ``evaluate.pvi``: PVI handlers (:mod:`clients.pvi`).

``app`` reads its settings from Flower's run config (``flwr run``); :func:`make_client_app` bakes
explicit settings in, for ``flwr.simulation.run_simulation`` whose run config is empty.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedbayes_flwr.config import parse_run_config
from fedbayes_flwr.experiment import Experiment, build_experiment

from .pvi import pvi_evaluate_handler, pvi_train_handler


def _partition_id(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ValueError("node config lacks 'partition-id' (start the SuperNode with "
                         "--node-config \"partition-id=K num-partitions=M\")")
    return int(context.node_config["partition-id"])


def make_client_app(overrides: dict | None = None) -> ClientApp:
    """A ClientApp whose run config is ``context.run_config`` updated by ``overrides``."""
    overrides = dict(overrides or {})
    app = ClientApp()

    def experiment(context: Context) -> Experiment:
        config = parse_run_config({**dict(context.run_config), **overrides})
        # Node-local data path (deployment): a SuperNode may point at its own file.
        if "data" in context.node_config:
            config = config.replace(data=str(context.node_config["data"]))
        if "client-delay" in context.node_config:  # a real device's own simulated slowness
            config = config.replace(client_delay=float(context.node_config["client-delay"]))
        return build_experiment(config)

    @app.query("partition")
    def partition(message: Message, context: Context) -> Message:
        content = RecordDict({"config": ConfigRecord({"partition-id": _partition_id(context)})})
        return Message(content, reply_to=message)

    @app.train("pvi")
    def train_pvi(message: Message, context: Context) -> Message:
        return pvi_train_handler(experiment(context), _partition_id(context), message, context)

    @app.evaluate("pvi")
    def evaluate_pvi(message: Message, context: Context) -> Message:
        return pvi_evaluate_handler(experiment(context), _partition_id(context), message,
                                    context)

    return app


app = make_client_app()
