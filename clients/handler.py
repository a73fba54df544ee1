"""The one ClientApp handler every algorithm uses: decode, call the library, encode. No maths.

A request arrives as ``<category>.<bundle>`` with its action, update number and attempt in the
ConfigRecord. The handler decodes the message against the bundle's template, loads the client
state from the node's ``context.state`` (it survives between messages, in simulation and
deployment alike), runs :func:`fedbayes_flwr.engine.client_work` (the same function the in-process
engine calls: same seed, same fault injection), stores the new state and encodes the reply.
"""

from __future__ import annotations

import time

from flwr.app import Context, Message

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.base import Request
from fedbayes_flwr.engine import client_work
from fedbayes_flwr.experiment import EXPECT, MISMATCH, Experiment, fingerprint, mismatches
from fedbayes_flwr.faults import client_delay_s


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
    if action not in exp.actions:
        raise ValueError(f"bundle {exp.bundle.name!r} has no action {action!r}; known: "
                         f"{', '.join(exp.actions)}")
    spec = exp.actions[action]
    request = Request(action, codec.decode(message.content, f"{exp.bundle.name}.{action}",
                                           spec.request))
    template = exp.bundle.client_state_template(exp.setup)
    state = (codec.load_state(context.state, state_key(exp), template)
             or exp.bundle.init_client(exp.setup, partition_id))
    delay = client_delay_s(exp.config, partition_id) if spec.category == "train" else 0.0
    if delay > 0:  # simulated slow device (client-delay / stragglers)
        time.sleep(delay)
    state, reply = client_work(exp, state, partition_id, request, number, attempt)
    codec.save_state(context.state, state_key(exp), state)
    return Message(codec.encode(reply, f"{exp.bundle.name}.{action}.reply"), reply_to=message)
