"""Checkpoint and resume over Flower: the client-state exchange. Transport only.

Flower keeps a node's client state in ``context.state``, which a new run (``--resume``) and a
SuperNode restart lose. So, for bundles whose clients keep state (PVI's factors, DSVGD's local
particles, decentralized HMC's agents):

* at every checkpoint (after each history row) the server asks every partition for its state
  and version (``client-state.get``) and stores them in the checkpoint with its own state
  (:mod:`fedbayes_flwr.runtime.checkpoint`); a checkpoint is written whole or not at all: if a
  partition does not answer, the previous checkpoint stays. Asynchronous runs ask a node that
  is busy at the checkpointed update once its in-flight reply has been applied
  (:func:`snapshot_idle`), never while it computes;
* on resume it sends each partition its stored state and version (``client-state.put``) before
  the first exchange;
* every request carries the version the server last saw from the partition (the number of
  requests its node has answered); a node holding an older one (it lost its state) refuses
  with :data:`fedbayes_flwr.runtime.checkpoint.STATE_LOST` instead of answering from a fresh state
  (PVI would count its data twice). The server then puts back its last checkpointed state if
  that is the version the node should hold (the node restarted between a checkpoint and its
  next request); otherwise the partition is left out of the rest of the run (its requests are
  recorded as rejections, not sent), and a resumed run leaves it out too.

Stateless bundles (SGLD, FedAvg, AMPS, PDMC) skip the exchange.
"""

from __future__ import annotations

import time
from logging import WARNING

from flwr.app import Message
from flwr.common import log

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.base import Rejection
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.runtime.checkpoint import (
    STATE_GET,
    STATE_LOST,
    STATE_PUT,
    VERSION_KEY,
    StateAck,
    check_client_count,
    check_fits,
    is_stateful,
)
from fedbayes_flwr.runtime.experiment import EXPECT
from fedbayes_flwr.runtime.steps import check_stop

POLL_S = 0.01


def stateful(strategy) -> bool:
    return is_stateful(strategy.bundle.client_state_template(strategy.setup))


def _message(strategy, grid, pid: int, action: str, body, version: int) -> Message:
    envelope = {"action": action, "round": strategy._update, "attempt": 0, VERSION_KEY: version,
                **{f"{EXPECT}{k}": v for k, v in strategy.expected.items()}}
    content = codec.encode(body, f"{strategy.bundle.name}.client-state", envelope)
    return Message(content, dst_node_id=strategy._node_map(grid)[pid],
                   message_type=f"query.{strategy.bundle.name}")


def reported_version(content) -> int:
    """The client-state version a reply reports; 0 when it has none or a malformed one (a
    reply is read here before it is validated: nothing in it may raise)."""
    try:
        version = codec.config_of(content).get(VERSION_KEY, 0)
    except KeyError:  # no config record at all: the codec rejects the reply next
        return 0
    return version if type(version) is int and version >= 0 else 0


def _exchange(strategy, grid, messages: dict) -> dict:
    """Send ``{pid: message}`` (its own push/pull loop: an asynchronous run's requests stay in
    flight meanwhile); ``{pid: reply}`` for the replies without an error within
    ``round_timeout``."""
    if not messages:
        return {}
    ids = list(grid.push_messages(list(messages.values())))
    sent = dict(zip(ids, messages, strict=True))
    replies, deadline = [], time.monotonic() + strategy.round_timeout
    while sent.keys() - {r.metadata.reply_to_message_id for r in replies}:
        check_stop()
        if time.monotonic() > deadline:
            break
        got = list(grid.pull_messages([m for m in sent if m not in
                                       {r.metadata.reply_to_message_id for r in replies}]))
        replies += got
        if not got:
            time.sleep(POLL_S)
    out = {}
    for reply in replies:
        pid = sent.get(reply.metadata.reply_to_message_id)
        if pid is None:
            continue
        if reply.has_error():
            log(WARNING, "%s: partition %s: client-state exchange failed: %s",
                strategy.bundle.name, pid, reply.error.reason.strip().splitlines()[-1])
            continue
        out[pid] = reply
    return out


def fetch(strategy, grid, pids) -> dict | None:
    """``{pid: (client state, version)}`` of the live partitions among ``pids``, asked now; None
    if one did not answer. A node behind the version the server saw lost its state: it is left
    out of the run (:func:`heal`) and absent from the result."""
    live = [p for p in pids if p not in strategy.dead]
    messages = {p: _message(strategy, grid, p, STATE_GET, StateAck(strategy.versions[p]),
                            strategy.versions[p]) for p in live}
    replies = _exchange(strategy, grid, messages)
    template = strategy.bundle.client_state_template(strategy.setup)
    kind = f"{strategy.bundle.name}.client-state"
    out = {}
    for p in live:
        reply = replies.get(p)
        version = None if reply is None else reported_version(reply.content)
        if version is not None and version < strategy.versions[p]:  # the node lost it
            heal(strategy, p)  # cannot be put back now (it moved on since): left out
            if p in strategy.dead:
                continue  # its last checkpointed state stands for it (assemble)
            version = None
        if version is None:
            log(WARNING, "%s: no checkpoint after update %d: partition %s did not send its "
                "current client state (the previous checkpoint stays)", strategy.bundle.name,
                strategy._update, p)
            return None
        try:
            out[p] = codec.decode(reply.content, kind, template, exact_shapes=False), version
        except codec.CodecError as err:
            log(WARNING, "%s: no checkpoint after update %d: partition %s sent a bad client "
                "state (%s)", strategy.bundle.name, strategy._update, p, err)
            return None
        strategy.versions[p] = max(strategy.versions[p], version)
    return out


def assemble(strategy, got: dict) -> tuple[tuple, tuple]:
    """Every partition's ``(client states, versions)`` from ``got`` (``{pid: (state,
    version)}``); a partition left out of the run keeps its last checkpointed state."""
    stored = strategy._stored
    known = stored is not None and bool(stored[1])
    states, versions = [], []
    for p in range(strategy.num_clients):
        if p in got:
            state, version = got[p]
        elif known:
            state, version = stored[0][p], stored[1][p]
        else:
            state, version = strategy.bundle.init_client(strategy.setup, p), 0
        states.append(state)
        versions.append(version)
    return tuple(states), tuple(versions)


def collect(strategy, grid) -> tuple[tuple, tuple] | None:
    """Every partition's ``(client states, versions)`` now (barrier runs: every node is
    idle), or None if one did not answer."""
    pids = range(strategy.num_clients)
    if not stateful(strategy):
        return tuple(strategy.bundle.init_client(strategy.setup, p) for p in pids), ()
    got = fetch(strategy, grid, pids)
    return None if got is None else assemble(strategy, got)


def put(strategy, grid, pids, states, versions) -> list[int]:
    """Send partitions ``pids`` their ``states[pid]`` at ``versions[pid]``; the partitions that
    acknowledged."""
    messages = {p: _message(strategy, grid, p, STATE_PUT, states[p], versions[p]) for p in pids
                if p not in strategy.dead}
    done = sorted(_exchange(strategy, grid, messages))
    for p in done:
        strategy.versions[p] = int(versions[p])
    return done


# ------------------------------------------------------------------ the strategy's side
def resume(strategy, ckpt) -> None:
    """Continue the run stored in ``ckpt`` (a :class:`fedbayes_flwr.runtime.checkpoint.Checkpoint`):
    its server state and update number now; its client states are sent to the partitions
    when the strategy starts (:func:`restore_clients`)."""
    check_fits(ckpt, strategy.bundle.name, strategy.state)
    check_client_count(ckpt, strategy.num_clients)
    strategy.state = ckpt.server_state
    strategy._update = strategy._recorded = int(ckpt.update)
    # faults at or before the stored update fired in the run that wrote it
    strategy._last_train = dict.fromkeys(range(strategy.num_clients), int(ckpt.update))
    strategy._settled = True
    # an in-process checkpoint has no versions: its clients start again from version 0
    versions = tuple(ckpt.client_versions) or (0,) * strategy.num_clients
    strategy.versions = list(versions)
    strategy._stored = (tuple(ckpt.client_states), versions)
    strategy._to_restore = stateful(strategy)
    for pid in ckpt.counters.get("dead", ()):  # left out of the stored run: still out
        leave_out(strategy, int(pid), "left out of the stored run (resumed without it)")


def after_record(strategy, virtual_time: float | None) -> None:
    """After a record: collect the client states and call ``strategy.on_checkpoint``."""
    if strategy.on_checkpoint is None or strategy._grid is None:
        return
    if strategy.bundle.mode(strategy.setup.config) == "apply-on-arrival" and stateful(strategy):
        if strategy._due is None:  # complete when every busy node has answered (below)
            strategy._due = {"update": strategy._update, "state": strategy.state, "got": {},
                             "virtual_time": virtual_time, "dead": sorted(strategy.dead)}
        snapshot_idle(strategy)
        return
    got = collect(strategy, strategy._grid)
    if got is not None:
        strategy._stored = got
        strategy.on_checkpoint(strategy._update, strategy.state, got[0], got[1], virtual_time,
                               sorted(strategy.dead))


def snapshot_idle(strategy) -> None:
    """Asynchronous runs: a checkpoint of update ``U`` needs each node's state as of ``U``.

    A node idle at ``U`` is asked at once; a node busy at ``U`` is asked as soon as its
    in-flight reply has been applied, before its next request: its committed factor is then
    still the one the server had at ``U`` (the acknowledgement it last received), and the
    factor its reply proposed is dropped on resume (commit on acknowledgement). The checkpoint
    is written once every node has answered; a node that cannot answer abandons it (the
    previous checkpoint stays).
    """
    due = strategy._due
    if due is None or strategy._grid is None:
        return
    ask = sorted(p for p in strategy._idle if p not in due["got"] and p not in strategy.dead)
    got = fetch(strategy, strategy._grid, ask) if ask else {}
    if got is None:
        strategy._due = None
        return
    due["got"].update(got)
    if set(due["got"]) | strategy.dead >= set(range(strategy.num_clients)):
        strategy._due = None
        states, versions = assemble(strategy, due["got"])
        strategy._stored = (states, versions)
        strategy.on_checkpoint(due["update"], due["state"], states, versions,
                               due["virtual_time"], due["dead"])


def restore_clients(strategy, grid) -> None:
    """Resume: send every live partition its stored client state before the first exchange;
    raise :class:`fedbayes_flwr.runtime.engine.RunStopped` naming those that did not take it."""
    states, versions = strategy._stored
    pids = [p for p in range(strategy.num_clients) if p not in strategy.dead]
    done = put(strategy, grid, pids, states, versions)
    strategy._to_restore = False
    if len(done) < len(pids):
        raise RunStopped(f"resume: partitions {sorted(set(pids) - set(done))} did not take "
                         f"back their client state")


def heal(strategy, pid: int) -> None:
    """Partition ``pid``'s node lost its client state (it refused with ``STATE_LOST``): put
    back the last checkpointed state when it is the version the node should hold (it
    restarted between a checkpoint and its next request); else leave the partition out of
    the run (answering from a fresh state would count its data twice)."""
    stored = strategy._stored
    if (strategy._grid is not None and stored is not None and stored[1]
            and stored[1][pid] == strategy.versions[pid]
            and put(strategy, strategy._grid, [pid], stored[0], stored[1])):
        log(WARNING, "%s: partition %s lost its client state: put back the checkpointed "
            "one (version %d)", strategy.bundle.name, pid, strategy.versions[pid])
        return
    leave_out(strategy, pid, f"{STATE_LOST} and the last checkpoint holds another version")


def leave_out(strategy, pid: int, reason: str) -> None:
    """Partition ``pid`` gets no further requests this run; its rejections carry ``reason``."""
    log(WARNING, "%s: partition %s: %s; it gets no further requests", strategy.bundle.name, pid,
        reason)
    strategy.dead.add(pid)
    strategy.failed[pid] = Rejection(pid, "reply", f"{reason}; not sent")
