"""The generic strategy's drivers: how :class:`strategies.base.BundleStrategy` moves messages
through a Flower Grid. Transport only.

* ``barrier`` bundles (:func:`run_barrier`): one push and a 50 ms pull loop per exchange (so
  Ctrl-C is seen within a poll, and deployment does not pay ``send_and_receive``'s 3 s
  sleeps);
* ``apply-on-arrival`` bundles (:func:`run_on_arrival`): ``grid.push_messages`` /
  ``grid.pull_messages``, each reply applied the moment it is pulled.

The strategy keeps the state (node map, pending requests, tallies); these functions only
drive it, through its ``_encode`` / ``_decode`` / ``_apply`` / ``_record`` steps.
"""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.runtime.steps import check_stop

from .checkpointing import snapshot_idle

POLL_S = 0.002  # pull interval while apply-on-arrival requests are in flight
BARRIER_POLL_S = 0.05  # pull interval of a barrier exchange (Flower's own sleeps 3 s deployed)


def send_and_receive(strategy, grid: Grid, messages: list, timeout: float) -> list:
    """Push, then pull every ``BARRIER_POLL_S`` until every reply is in or ``timeout``;
    a stop request (Ctrl-C) interrupts the wait."""
    if not messages:  # every partition asked is dead
        return []
    ids = list(grid.push_messages(messages))
    strategy._sent = {mid: strategy.partition_of[m.metadata.dst_node_id]
                      for mid, m in zip(ids, messages, strict=True)}
    waiting = set(ids)
    replies, deadline = [], time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        check_stop()
        got = list(grid.pull_messages(list(waiting)))
        replies += got
        waiting -= {m.metadata.reply_to_message_id for m in got}
        if waiting:
            time.sleep(BARRIER_POLL_S)
    return replies



def run_barrier(strategy, grid: Grid, timeout: float, evaluate_fn, result: Result) -> None:
    """``barrier`` bundles: one push and a ``BARRIER_POLL_S`` pull loop per exchange, every
    reply of the exchange in one server step, retries and stops by the failure policy."""
    while True:
        check_stop()
        messages = strategy.configure_train(strategy._update, ArrayRecord(), ConfigRecord(), grid)
        got = strategy._by_partition(send_and_receive(strategy, grid, messages, timeout))
        decoded = {pid: strategy._decode(pid, req.action, got.get(pid))
                   for pid, req in strategy._pending.items()}
        strategy._apply(strategy._retry_or_stop(grid, decoded, timeout))
        if strategy._settled and strategy._record(evaluate_fn, result):
            return



def run_on_arrival(strategy, grid: Grid, timeout: float, evaluate_fn, result: Result) -> None:
    """``apply-on-arrival`` bundles (asynchronous PVI, event-based samplers): each reply is
    applied the moment it is pulled and the freed client gets its next request at once; a
    request without a reply within ``timeout`` marks its partition dead."""
    in_flight: dict[str, tuple[int, object]] = {}  # message id -> (partition, request)
    arrived: list[Message] = []  # pulled, not yet applied
    idle = set(range(strategy.num_clients)) - strategy.dead
    strategy._idle = idle  # the same set: what an asynchronous checkpoint may ask now
    sent_at: dict[str, float] = {}  # message id -> when it was pushed
    while True:
        strategy._rnd = strategy._next_round(frozenset(idle))
        requests = strategy.bundle.requests(strategy.state, strategy.setup, strategy._rnd)
        for pid, req in sorted(requests.items()):
            message = strategy._encode(grid, pid, req, strategy._rnd.number, 0)
            (mid,) = grid.push_messages([message])
            in_flight[mid], sent_at[mid] = (pid, req), time.monotonic()
            strategy._sent[mid] = pid
            idle.discard(pid)
        if not in_flight:
            if strategy.dead:
                raise RunStopped(f"update {strategy._rnd.number}: no partition left to ask "
                                 f"(partitions {sorted(strategy.dead)} timed out)")
            raise RuntimeError(f"bundle {strategy.bundle.name!r} sent no request with every "
                               f"client idle")
        late = None
        while not arrived and late is None:  # pulled replies leave the Grid: keep them
            arrived += list(grid.pull_messages(list(in_flight)))
            if not arrived:
                check_stop()
                oldest = min(in_flight, key=sent_at.__getitem__)
                if time.monotonic() - sent_at[oldest] > timeout:
                    late = oldest  # its reply never came: a timeout, the partition dies
                else:
                    time.sleep(POLL_S)
        if arrived:
            # apply ONE reply (the lowest partition among those pulled); the rest wait
            arrived.sort(key=lambda r: in_flight[r.metadata.reply_to_message_id][0])
            reply = arrived.pop(0)
            mid = reply.metadata.reply_to_message_id
            if not strategy._by_partition_of(in_flight[mid][0], reply):
                reply = None  # from a node that is not the one asked: refused (logged)
        else:
            reply, mid = None, late
        pid, req = in_flight.pop(mid)
        sent_at.pop(mid)
        strategy._sent.pop(mid, None)
        decoded = strategy._decode(pid, req.action, reply)
        if pid not in strategy.dead:  # a timed-out partition never becomes idle again
            idle.add(pid)
        strategy._apply({pid: decoded})
        snapshot_idle(strategy)
        if strategy._record(evaluate_fn, result, round(time.monotonic() - strategy._t0, 4)):
            return
