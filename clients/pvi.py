"""ClientApp handlers for PVI: decode, call :mod:`fedbayes_flwr.pvi`, encode. No maths here.

The client's factor ``t_k`` (and its pending update) persists in ``context.state`` between rounds,
in simulation and deployment alike.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Context, Message

from fedbayes_flwr import codec, pvi
from fedbayes_flwr.experiment import Experiment, active_fault, client_delay_s, corrupt_reply


def _load(exp: Experiment, context: Context) -> pvi.ClientState:
    fresh = pvi.init_client(exp.prior)
    return codec.load_state(context.state, pvi.KIND_STATE, fresh) or fresh


def pvi_train_handler(exp: Experiment, partition_id: int, message: Message,
                      context: Context) -> Message:
    """Handle ``train.pvi``: one local PVI update; reply with the damped delta."""
    template = pvi.TrainRequest(pvi.broadcast(pvi.init_server(exp.prior, 1), 0, 0),
                                pvi.PVIConfig())
    request = codec.decode(message.content, pvi.KIND_TRAIN, template)
    fault = active_fault(exp.config, request.message.server_round, partition_id)
    if fault in ("error", "drop"):
        raise RuntimeError(f"injected fault {fault!r} (inject-fault)")
    delay = client_delay_s(exp.config, partition_id)
    if delay > 0:  # simulated slow device (client-delay / stragglers)
        time.sleep(delay)
    x, y = exp.client_data(partition_id)
    state, reply = pvi.client_step(_load(exp, context), request.message, exp.model, x, y,
                                   request.config, exp.prior, exp.num_clients)
    codec.save_state(context.state, pvi.KIND_STATE, state)
    if fault:
        reply = corrupt_reply(fault, reply, request.message.posterior)
    return Message(codec.encode(reply, pvi.KIND_REPLY), reply_to=message)


def pvi_evaluate_handler(exp: Experiment, partition_id: int, message: Message,
                         context: Context) -> Message:
    """Handle ``evaluate.pvi``: this client's term of the global free energy."""
    template = pvi.EvalMessage(exp.prior, 0)
    request = codec.decode(message.content, pvi.KIND_EVAL, template)
    x, y = exp.client_data(partition_id)
    state, term = pvi.free_energy_term(_load(exp, context), request.posterior,
                                       request.accepted_round, exp.model, x, y)
    codec.save_state(context.state, pvi.KIND_STATE, state)
    return Message(codec.encode(pvi.EvalReply(np.asarray([term], np.float64)), pvi.KIND_TERM),
                   reply_to=message)
