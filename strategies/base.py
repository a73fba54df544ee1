"""The generic Flower strategy: runs any algorithm bundle over the Grid. Transport only.

:class:`BundleStrategy` owns what every family needs from Flower: the node <-> partition map
(asked once, :func:`strategies.nodes.partition_map`), encoding requests and decoding replies
(:mod:`fedbayes_flwr.codec`), validating them with the library's own
:func:`fedbayes_flwr.engine.judge` (the in-process engine runs the same check), logging and
counting rejections, byte accounting, the failure policy, and recording at evaluation points.
Its :meth:`BundleStrategy.start` drives

* ``barrier`` bundles with one push and a 50 ms pull loop per exchange (so Ctrl-C is seen
  within a poll, and deployment does not pay `send_and_receive`'s 3 s sleeps), and
* ``apply-on-arrival`` bundles (asynchronous PVI, event-based samplers) with
  ``grid.push_messages`` / ``grid.pull_messages``: each reply is applied the moment it is pulled
  and the freed client gets its next request at once.

Each request travels as ``<category>.<bundle>`` (``train.pvi``) with the action, the update
number and the attempt in its ConfigRecord (the client derives its seed from them), so one
ClientApp serves every bundle. Named strategies (:class:`strategies.PVIStrategy`, ...) are thin
subclasses that build the bundle's :class:`~fedbayes_flwr.algorithms.base.Setup`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.base import Rejection, Round, round_seed
from fedbayes_flwr.config import section_items
from fedbayes_flwr.engine import (
    RoundLog,
    RunStopped,
    Tally,
    check_stop,
    eval_point,
    judge,
    outcome,
    stop_on_failure,
)
from fedbayes_flwr.experiment import EXPECT, MISMATCH, fingerprint, payload_nbytes

from .nodes import partition_map

POLL_S = 0.002
BARRIER_POLL_S = 0.05  # pull interval of a barrier exchange (Flower's own sleeps 3 s deployed)


def message_type(category: str, bundle_name: str) -> str:
    return f"{category}.{bundle_name}"


class BundleStrategy(Strategy):
    """Any algorithm bundle as a Flower strategy.

    Parameters
    ----------
    bundle : fedbayes_flwr.algorithms.base.Bundle
    setup : fedbayes_flwr.algorithms.base.Setup
        Model, prior, number of partitions, run seed and the bundle's config section.
    eval_every : int
        Record every ``eval_every`` server updates (and always after the last).
    max_seconds : float
        Stop at the first evaluation point after this many seconds (0: no limit).
    max_retries : int
        Re-sends per failed request for bundles with the ``retry`` failure policy.
    node_timeout : float
        Seconds to wait for the nodes serving the partitions to connect (progress is logged
        every 10 s; nodes started for another number of partitions fail at once).
    run_config : dict, optional
        The run config the server was built from: its experiment-defining keys travel with
        every request, and a client that built a different experiment refuses (the run stops
        with the differing keys) instead of silently training on something else.
    """

    def __init__(self, bundle, setup, *, eval_every: int = 1, max_seconds: float = 0.0,
                 max_retries: int = 2, run_config: dict | None = None,
                 node_timeout: float = 600.0):
        self.bundle, self.setup = bundle, setup
        # what every client must share with this server (checked by the client handler)
        self.expected = fingerprint(bundle.name, setup, run_config)
        self.actions = bundle.actions(setup)
        self.state = bundle.init_server(setup)
        self.num_clients = setup.num_clients
        self.run_seed = setup.run_seed
        self.eval_every, self.max_seconds, self.max_retries = eval_every, max_seconds, max_retries
        self.node_timeout = node_timeout
        self.nodes: dict[int, int] | None = None
        self.partition_of: dict[int, int] = {}
        self.round_logs: dict[int, RoundLog] = {}
        self.outcome: str | None = None
        self._tally = Tally()
        self._update, self._step, self._settled, self._recorded = 0, 0, True, 0
        self._pending: dict[int, object] = {}  # partition -> Request of the current exchange
        self._num_updates = 1
        self._rnd: Round | None = None

    # ------------------------------------------------------------------ helpers
    @property
    def posterior(self):
        """The current posterior (:class:`fedbayes_flwr.posterior.Posterior`)."""
        return self.bundle.posterior(self.state, self.setup)

    def posterior_arrays(self) -> ArrayRecord:
        """Posterior mean and standard deviation as an ``ArrayRecord`` (Flower's ``Result``)."""
        post = self.posterior
        return ArrayRecord({"mean": Array(post.mean()), "std": Array(post.std())})

    def initial_arrays(self) -> ArrayRecord:
        return self.posterior_arrays()

    def _node_map(self, grid: Grid) -> dict[int, int]:
        if self.nodes is None:
            self.nodes = partition_map(grid, self.num_clients, timeout=self.node_timeout)
            self.partition_of = {node: pid for pid, node in self.nodes.items()}
        return self.nodes

    def _next_round(self, idle: frozenset) -> Round:
        number = self._update + 1 if self._settled else self._update
        self._step = 0 if self._settled else self._step + 1
        return Round(number, self._step, round_seed(self.run_seed, self.bundle.name, number,
                                                    self._step),
                     idle, eval_point(number, self.eval_every, self._num_updates))

    def _encode(self, grid: Grid, pid: int, request, number: int, attempt: int) -> Message:
        nodes = self._node_map(grid)
        spec = self.actions[request.action]
        self._tally.down += payload_nbytes(request.message)
        envelope = {"action": request.action, "round": number, "attempt": attempt,
                    **{f"{EXPECT}{k}": v for k, v in self.expected.items()}}
        content = codec.encode(request.message, f"{self.bundle.name}.{request.action}", envelope)
        return Message(content, dst_node_id=nodes[pid],
                       message_type=message_type(spec.category, self.bundle.name))

    def _decode(self, pid: int, action: str, reply: Message | None):
        """The reply's message, or the :class:`Rejection` it earns (logged)."""
        if reply is None:
            out = Rejection(pid, "reply", "no reply before the timeout")
        elif reply.has_error():
            if MISMATCH in reply.error.reason:  # server and client disagree: never go on
                raise RunStopped(f"partition {pid}: {reply.error.reason.strip().splitlines()[-1]}")
            out = Rejection(pid, "reply", f"client error: {reply.error.reason}")
        else:
            self._tally.up += codec.received_nbytes(reply.content)
            spec = self.actions[action]
            try:
                message = codec.decode(reply.content, f"{self.bundle.name}.{action}.reply",
                                       spec.reply, spec.allow_inf)
            except codec.CodecError as err:
                out = Rejection(pid, err.field, err.reason)
            else:
                out = judge(self.bundle, self.setup, self.actions, self.state, pid, action,
                            message)
        if isinstance(out, Rejection):
            log(WARNING, "%s: rejected reply of partition %s (node %s), field %s: %s",
                self.bundle.name, pid, (self.nodes or {}).get(pid), out.field, out.reason)
        return out

    def _by_partition(self, replies: Iterable[Message]) -> dict[int, Message]:
        out = {}
        for reply in replies:
            pid = self.partition_of.get(reply.metadata.src_node_id)
            if pid is None or pid not in self._pending:
                log(WARNING, "%s: ignoring a reply from unexpected node %s", self.bundle.name,
                    reply.metadata.src_node_id)
                continue
            out[pid] = reply
        return out

    # ------------------------------------------------------------------ one exchange
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The messages of the next exchange (for Flower's own round loop; :meth:`start` uses
        the same path)."""
        self._rnd = self._next_round(frozenset(range(self.num_clients)))
        requests = self.bundle.requests(self.state, self.setup, self._rnd)
        self._pending = dict(sorted(requests.items()))
        return [self._encode(grid, pid, req, self._rnd.number, 0)
                for pid, req in self._pending.items()]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Decode, validate and apply the exchange's replies (one server step)."""
        got = self._by_partition(replies)
        decoded = {pid: self._decode(pid, req.action, got.get(pid))
                   for pid, req in self._pending.items()}
        self._apply(decoded)
        return self.posterior_arrays(), MetricRecord({
            "rejected-replies": sum(isinstance(r, Rejection) for r in decoded.values())})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """A follow-up exchange when the last step left the update unsettled, else nothing."""
        return [] if self._settled else self.configure_train(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        if not self._pending:
            return None
        return self.aggregate_train(server_round, replies)[1]

    def _apply(self, decoded: dict) -> None:
        self._pending = {}
        self.state, info = self.bundle.server_step(self.state, sorted(decoded.items()),
                                                   self.setup, self._rnd)
        self._update += info.updates
        self._settled = info.settled
        self._tally.add(info)

    def _retry_or_stop(self, grid: Grid, decoded: dict, timeout: float) -> dict:
        policy = self.bundle.failure_policy
        if policy in ("retry", "retry-stop"):
            for attempt in range(1, self.max_retries + 1):
                failed = [pid for pid, r in decoded.items() if isinstance(r, Rejection)]
                if not failed:
                    break
                self._tally.retried += len(failed)
                messages = [self._encode(grid, pid, self._pending[pid], self._rnd.number,
                                         attempt) for pid in failed]
                got = self._by_partition(self._send_and_receive(grid, messages, timeout))
                for pid in failed:
                    decoded[pid] = self._decode(pid, self._pending[pid].action, got.get(pid))
        if policy in ("stop", "retry-stop"):
            stop_on_failure(self.bundle.name, self._rnd.number, decoded)
        return decoded

    # ------------------------------------------------------------------ the drivers
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Run ``num_rounds`` server updates; ``evaluate_fn(update, arrays)`` at each evaluation
        point (every ``eval_every`` updates and after the last), with
        ``self.round_logs[update]`` holding what happened since the previous one.

        Raises :class:`fedbayes_flwr.engine.RunStopped` when a ``stop``-policy bundle fails.
        """
        self.summary()
        self._num_updates = num_rounds
        self._t0 = time.monotonic()
        result = Result()
        if self.bundle.mode(self.setup.config) == "apply-on-arrival":
            self._run_on_arrival(grid, timeout, evaluate_fn, result)
        else:
            self._run_barrier(grid, timeout, evaluate_fn, result)
        log(INFO, "%s: %d updates in %.2fs (%s)", self.bundle.name, self._update,
            time.monotonic() - self._t0, self.outcome)
        return result

    def _record(self, evaluate_fn, result: Result, virtual_time: float | None = None) -> bool:
        """At an evaluation point: log, call ``evaluate_fn``; True when the run ends here."""
        if self._update == self._recorded:  # nothing new since the last record
            return False
        finished = self._update >= self._num_updates
        if not (eval_point(self._update, self.eval_every, self._num_updates) or finished):
            return False
        self.outcome = outcome(self.bundle, self.setup, self.state, finished,
                               time.monotonic() - self._t0, self.max_seconds)
        self._recorded = self._update
        self.round_logs[self._update] = self._tally.log(virtual_time)._replace(
            outcome=self.outcome)
        arrays = self.posterior_arrays()
        result.arrays = arrays
        if evaluate_fn is not None:
            evaluate_fn(self._update, arrays)
        return self.outcome is not None

    def _send_and_receive(self, grid: Grid, messages: list, timeout: float) -> list:
        """Push, then pull every ``BARRIER_POLL_S`` until every reply is in or ``timeout``;
        a stop request (Ctrl-C) interrupts the wait."""
        waiting = set(grid.push_messages(messages))
        replies, deadline = [], time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            check_stop()
            got = list(grid.pull_messages(list(waiting)))
            replies += got
            waiting -= {m.metadata.reply_to_message_id for m in got}
            if waiting:
                time.sleep(BARRIER_POLL_S)
        return replies

    def _run_barrier(self, grid: Grid, timeout: float, evaluate_fn, result: Result) -> None:
        while True:
            check_stop()
            messages = self.configure_train(self._update, ArrayRecord(), ConfigRecord(), grid)
            got = self._by_partition(self._send_and_receive(grid, messages, timeout))
            decoded = {pid: self._decode(pid, req.action, got.get(pid))
                       for pid, req in self._pending.items()}
            self._apply(self._retry_or_stop(grid, decoded, timeout))
            if self._settled and self._record(evaluate_fn, result):
                return

    def _run_on_arrival(self, grid: Grid, timeout: float, evaluate_fn, result: Result) -> None:
        in_flight: dict[str, tuple[int, object]] = {}  # message id -> (partition, request)
        arrived: list[Message] = []  # pulled, not yet applied
        idle = set(range(self.num_clients))
        last_arrival = time.monotonic()
        while True:
            self._rnd = self._next_round(frozenset(idle))
            requests = self.bundle.requests(self.state, self.setup, self._rnd)
            for pid, req in sorted(requests.items()):
                (mid,) = grid.push_messages([self._encode(grid, pid, req, self._rnd.number, 0)])
                in_flight[mid] = (pid, req)
                idle.discard(pid)
            if not in_flight:
                raise RuntimeError(f"bundle {self.bundle.name!r} sent no request with every "
                                   f"client idle")
            while not arrived:  # pulled replies leave the Grid: keep them until applied
                arrived += list(grid.pull_messages(list(in_flight)))
                if not arrived:
                    check_stop()
                    if time.monotonic() - last_arrival > timeout:
                        waiting = sorted(p for p, _ in in_flight.values())
                        raise TimeoutError(f"{self.bundle.name}: no reply for {timeout} s "
                                           f"(waiting on partitions {waiting})")
                    time.sleep(POLL_S)
            last_arrival = time.monotonic()
            # apply ONE reply (the lowest partition among those pulled); the rest wait their turn
            arrived.sort(key=lambda r: in_flight[r.metadata.reply_to_message_id][0])
            reply = arrived.pop(0)
            pid, req = in_flight.pop(reply.metadata.reply_to_message_id)
            idle.add(pid)
            self._apply({pid: self._decode(pid, req.action, reply)})
            if self._record(evaluate_fn, result, round(time.monotonic() - self._t0, 4)):
                return

    def summary(self) -> None:
        """One line: the bundle, partitions, seed and the section keys that differ from their
        defaults (settings that do not apply to this run are not listed as if they did)."""
        config = self.setup.config
        items = section_items(config)
        defaults = section_items(type(config)()) if items else {}
        changed = {k: v for k, v in items.items() if v != defaults[k]}
        log(INFO, "%s: %d partitions, seed %s, non-default keys %s", self.bundle.name,
            self.num_clients, self.run_seed, changed or "none")
