"""The one ClientApp handler every algorithm uses: decode, call the library, encode. No maths.

A request arrives as ``<category>.<bundle>`` with its action, update number and attempt in the
ConfigRecord. The handler decodes the message against the bundle's template, loads the client
state from the node's ``context.state`` (it survives between messages, in simulation and
deployment alike), runs :func:`fedbayes_flwr.runtime.steps.client_work` (the same function the in-process
engine calls: same seed, same fault injection), stores the new state and encodes the reply.
An injected ``hang`` sleeps past the message's time-to-live (bounded: then it raises, and a
deployed ClientApp process ends; a SuperNode runs one message at a time meanwhile).
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Context, Message

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.base import Request
from fedbayes_flwr.runtime.checkpoint import (
    STATE_GET,
    STATE_LOST,
    STATE_PUT,
    VERSION_KEY,
    StateAck,
    is_stateful,
)
from fedbayes_flwr.runtime.experiment import EXPECT, MISMATCH, Experiment, fingerprint, mismatches
from fedbayes_flwr.runtime.faults import (
    PREVIOUS_TRAIN,
    InjectedFault,
    client_delay_s,
    hang_seconds,
)
from fedbayes_flwr.runtime.steps import client_work


def state_key(exp: Experiment) -> str:
    return f"{exp.bundle.name}.client-state"


def check_same_experiment(exp: Experiment, envelope) -> None:
    """Raise ``ValueError`` naming every experiment-defining key on which this client's run
    config differs from the server's (node-local keys such as ``data`` excepted): the strategy
    then stops the run with that line instead of training on a different experiment."""
    expected = {k[len(EXPECT):]: v for k, v in envelope.items() if k.startswith(EXPECT)}
    if not expected:
        return
    mine = fingerprint(exp.bundle.name, exp.setup, exp.config.to_run_config())
    differ = mismatches(expected, mine)
    if differ:
        raise ValueError(f"{MISMATCH}: this client's run config differs from the server's "
                         f"({'; '.join(differ)}); give both apps the same settings")


def handle(exp: Experiment, partition_id: int, message: Message, context: Context) -> Message:
    """Answer one request of ``exp``'s bundle for partition ``partition_id``."""
    envelope = codec.config_of(message.content)
    check_same_experiment(exp, envelope)
    action, number = str(envelope["action"]), int(envelope["round"])
    attempt = int(envelope.get("attempt", 0))
    if action in (STATE_GET, STATE_PUT):
        return client_state_exchange(exp, partition_id, action, message, context)
    if action not in exp.actions:
        raise ValueError(f"bundle {exp.bundle.name!r} has no action {action!r}; known: "
                         f"{', '.join(exp.actions)}")
    spec = exp.actions[action]
    request = Request(action, codec.decode(message.content, f"{exp.bundle.name}.{action}",
                                           spec.request))
    template = exp.bundle.client_state_template(exp.setup)
    state = (codec.load_state(context.state, state_key(exp), template)
             or exp.bundle.init_client(exp.setup, partition_id))
    version = check_version(exp, context, envelope)
    delay = client_delay_s(exp.config, partition_id) if spec.category == "train" else 0.0
    if delay > 0:  # simulated slow device (client-delay / stragglers)
        time.sleep(delay)
    try:
        previous = envelope.get(PREVIOUS_TRAIN)
        state, reply = client_work(exp, state, partition_id, request, number, attempt,
                                   None if previous is None else int(previous))
    except InjectedFault as err:
        if err.kind == "hang":  # inject-fault hang: answer nothing until past the message's ttl
            time.sleep(hang_seconds(message.metadata.ttl))
        raise
    codec.save_state(context.state, state_key(exp), state)
    save_version(exp, context, version + 1)
    return Message(codec.encode(reply, f"{exp.bundle.name}.{action}.reply",
                                {VERSION_KEY: version + 1}), reply_to=message)


# ---------------------------------------------------------------- client-state versions, exchange
def version_key(exp: Experiment) -> str:
    return f"{exp.bundle.name}.client-version"


def stored_version(exp: Experiment, context: Context) -> int:
    """Requests this node has processed for the run (0 when it holds no state)."""
    record = context.state.config_records.get(version_key(exp))
    return int(record["version"]) if record is not None else 0


def save_version(exp: Experiment, context: Context, version: int) -> None:
    context.state[version_key(exp)] = ConfigRecord({"version": int(version)})


def check_version(exp: Experiment, context: Context, envelope) -> int:
    """This node's client-state version; raises ``ValueError`` (:data:`STATE_LOST`) when it is
    behind the version the server last saw from this partition: the node lost its state (a
    SuperNode restart, a new run) and answering from a fresh state would double-count (PVI's
    factor) or restart (DSVGD's particles). The server restores it from its checkpoint.
    Stateless clients (SGLD, FedAvg, AMPS, PDMC) have nothing to lose and always answer."""
    version = stored_version(exp, context)
    expected = int(envelope.get(VERSION_KEY, 0))
    if version < expected and is_stateful(exp.bundle.client_state_template(exp.setup)):
        raise ValueError(f"{STATE_LOST}: this node holds client-state version {version}, the "
                         f"server expects {expected} (the node lost its state, e.g. restarted); "
                         f"refusing to answer from a fresh state")
    return version


def client_state_exchange(exp: Experiment, partition_id: int, action: str, message: Message,
                          context: Context) -> Message:
    """``client-state.get``: upload this node's client state and version (the server's
    checkpoint); ``client-state.put``: replace them with the server's (resume, restore)."""
    kind = f"{exp.bundle.name}.client-state"
    template = exp.bundle.client_state_template(exp.setup)
    if action == STATE_PUT:
        state = codec.decode(message.content, kind, template, exact_shapes=False)
        version = int(codec.config_of(message.content)[VERSION_KEY])
        codec.save_state(context.state, state_key(exp), state)
        save_version(exp, context, version)
        return Message(codec.encode(StateAck(version), f"{kind}.ack"), reply_to=message)
    state = (codec.load_state(context.state, state_key(exp), template)
             or exp.bundle.init_client(exp.setup, partition_id))
    version = stored_version(exp, context)
    return Message(codec.encode(state, kind, {VERSION_KEY: version}), reply_to=message)
