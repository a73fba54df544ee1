"""The generic Flower strategy: runs any algorithm bundle over the Grid. Transport only.

:class:`BundleStrategy` owns what every family needs from Flower: the node <-> partition map
(asked once, :func:`strategies.nodes.partition_map`), encoding requests and decoding replies
(:mod:`fedbayes_flwr.codec`), validating them with the library's own
:func:`fedbayes_flwr.runtime.steps.judge` (the in-process engine runs the same check), logging and
counting rejections, byte accounting, the failure policy, and recording at evaluation points.
Its :meth:`BundleStrategy.start` drives ``barrier`` and ``apply-on-arrival`` bundles through
:mod:`strategies.drivers`; checkpoints, resume and nodes that lost their client state are
:mod:`strategies.checkpointing`.

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
from flwr.common.constant import SUPERLINK_NODE_ID as SUPERLINK_NODE
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.base import Rejection, Round, failure_policy, round_seed
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.inference.tree import payload_nbytes
from fedbayes_flwr.runtime.checkpoint import STATE_LOST, VERSION_KEY
from fedbayes_flwr.runtime.config import section_items
from fedbayes_flwr.runtime.experiment import EXPECT, MISMATCH, fingerprint
from fedbayes_flwr.runtime.faults import PREVIOUS_TRAIN
from fedbayes_flwr.runtime.steps import (
    RoundLog,
    Tally,
    eval_point,
    judge,
    not_sent,
    outcome,
    stop_on_failure,
    timed_out,
)

from . import checkpointing as ckpt_flower
from .drivers import run_barrier, run_on_arrival, send_and_receive
from .nodes import parse_node_ids, partition_nodes


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
    round_timeout : float
        Seconds each request may wait for its reply (every exchange, retries included); each
        message's time-to-live. A partition that times out is *dead*: it gets no further
        messages this run and stands in every later exchange as a rejected reply.
        :meth:`start`'s ``timeout`` overrides it.
    run_config : dict, optional
        The run config the server was built from: its experiment-defining keys travel with
        every request, and a client that built a different experiment refuses (the run stops
        with the differing keys) instead of silently training on something else.
    """

    def __init__(self, bundle, setup, *, eval_every: int = 1, max_seconds: float = 0.0,
                 max_retries: int = 2, run_config: dict | None = None,
                 node_timeout: float = 600.0, round_timeout: float = 600.0):
        self.bundle, self.setup = bundle, setup
        # what every client must share with this server (checked by the client handler)
        self.expected = fingerprint(bundle.name, setup, run_config)
        self.actions = bundle.actions(setup)
        self.state = bundle.init_server(setup)
        self.num_clients = setup.num_clients
        self.run_seed = setup.run_seed
        self.eval_every, self.max_seconds, self.max_retries = eval_every, max_seconds, max_retries
        self.node_timeout, self.round_timeout = node_timeout, round_timeout
        # the node ids a deployment registered (run-config key deployment-nodes): no other node
        # is sent work or heard from; None: any node (simulation, a user's own deployment)
        self.allowed_nodes = parse_node_ids((run_config or {}).get("deployment-nodes", ""))
        self.dead: set[int] = set()  # partitions that timed out: never asked again this run
        self.failed: dict[int, Rejection] = {}  # partitions whose node failed the query
        self._sent: dict[str, int] = {}  # message id -> partition (for replies the link makes)
        self.nodes: dict[int, int] | None = None
        self.partition_of: dict[int, int] = {}
        self.round_logs: dict[int, RoundLog] = {}
        self.outcome: str | None = None
        self._tally = Tally()
        self._update, self._step, self._settled, self._recorded = 0, 0, True, 0
        self._pending: dict[int, object] = {}  # partition -> Request of the current exchange
        self._num_updates = 1
        self._rnd: Round | None = None
        # checkpoint and resume (strategies.checkpointing): the hook called after each record
        # with (update, server state, client states, client versions), the client-state
        # version last seen per partition, the last stored client states, a restore to send
        self.on_checkpoint: Callable | None = None
        self.versions = [0] * self.num_clients
        self._last_train: dict[int, int] = {}  # partition -> update of its last train request
        self._stored: tuple | None = None
        self._to_restore = False
        self._due: dict | None = None  # an asynchronous checkpoint waiting for busy nodes
        self._idle: set[int] = set()
        self._grid: Grid | None = None

    # ------------------------------------------------------------------ helpers
    @property
    def posterior(self):
        """The current posterior (:class:`fedbayes_flwr.inference.posterior.Posterior`)."""
        return self.bundle.posterior(self.state, self.setup)

    def posterior_arrays(self) -> ArrayRecord:
        """Posterior mean and standard deviation as an ``ArrayRecord`` (Flower's ``Result``)."""
        post = self.posterior
        return ArrayRecord({"mean": Array(post.mean()), "std": Array(post.std())})

    def initial_arrays(self) -> ArrayRecord:
        return self.posterior_arrays()

    def _node_map(self, grid: Grid) -> dict[int, int]:
        """``{partition: node}``, asked once. A partition whose node answered the partition
        query with an error is *failed* (dead from the start, its rejections carry the node's
        own error): the run goes on without it."""
        if self.nodes is None:
            found = partition_nodes(grid, self.num_clients, timeout=self.node_timeout,
                                    allowed=self.allowed_nodes)
            self.nodes = found.nodes
            self.partition_of = {node: pid for pid, node in self.nodes.items()}
            self.failed = {pid: Rejection(pid, "reply", f"partition query failed: {reason}")
                           for pid, reason in found.failed.items()}
            self.dead |= set(self.failed)
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
                    VERSION_KEY: self.versions[pid],
                    **{f"{EXPECT}{k}": v for k, v in self.expected.items()}}
        if spec.category == "train":  # fault injection: the partition's previous train update
            envelope[PREVIOUS_TRAIN] = self._last_train.get(pid, 0)
            if attempt == 0:
                self._last_train[pid] = number
        content = codec.encode(request.message, f"{self.bundle.name}.{request.action}", envelope)
        return Message(content, dst_node_id=nodes[pid], ttl=self.round_timeout,
                       message_type=message_type(spec.category, self.bundle.name))

    def _decode(self, pid: int, action: str, reply: Message | None):
        """The reply's message, or the :class:`Rejection` it earns (logged). No reply (or the
        link's "message expired" error) within ``round_timeout`` marks the partition dead."""
        if pid in self.dead:
            return self.failed.get(pid) or not_sent(pid)
        if reply is None or (reply.has_error()
                             and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE):
            self.dead.add(pid)
            out = timed_out(pid, self.round_timeout)
        elif reply.has_error():
            if MISMATCH in reply.error.reason:  # server and client disagree: never go on
                raise RunStopped(f"partition {pid}: {reply.error.reason.strip().splitlines()[-1]}")
            out = Rejection(pid, "reply", f"client error: {reply.error.reason}")
            if STATE_LOST in reply.error.reason:  # put back now, or left out of the run
                ckpt_flower.heal(self, pid)
        else:
            self._tally.up += codec.received_nbytes(reply.content)
            self.versions[pid] = max(self.versions[pid], ckpt_flower.reported_version(reply.content))
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
        """The replies of the current exchange by partition (each checked by
        :meth:`_by_partition_of`); any other reply is refused and logged."""
        out = {}
        for reply in replies:
            pid = self._sent.get(reply.metadata.reply_to_message_id,
                                 self.partition_of.get(reply.metadata.src_node_id))
            if pid is None or pid not in self._pending:
                log(WARNING, "%s: refusing a reply from node %s (it answers no request of this "
                    "exchange)", self.bundle.name, reply.metadata.src_node_id)
                continue
            if self._by_partition_of(pid, reply):
                out[pid] = reply
        return out

    def _by_partition_of(self, pid: int, reply: Message) -> bool:
        """True when ``reply`` comes from the node serving partition ``pid`` (or from the
        SuperLink itself: Flower's own error replies); otherwise logs the refusal."""
        src = reply.metadata.src_node_id
        if src in ((self.nodes or {}).get(pid), SUPERLINK_NODE):
            return True
        log(WARNING, "%s: refusing a reply for partition %d from node %s (%s)", self.bundle.name,
            pid, src, "not the node it was sent to" if src in self.partition_of
            else "not a node of this run")
        return False

    # ------------------------------------------------------------------ one exchange
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The messages of the next exchange (for Flower's own round loop; :meth:`start` uses
        the same path)."""
        self._node_map(grid)
        self._rnd = self._next_round(frozenset(range(self.num_clients)))
        requests = self.bundle.requests(self.state, self.setup, self._rnd)
        self._pending = dict(sorted(requests.items()))
        return [self._encode(grid, pid, req, self._rnd.number, 0)
                for pid, req in self._pending.items() if pid not in self.dead]

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
        policy = failure_policy(self.bundle, self.setup.config)
        if policy in ("retry", "retry-stop"):
            for attempt in range(1, self.max_retries + 1):
                failed = [pid for pid, r in decoded.items()
                          if isinstance(r, Rejection) and pid not in self.dead]  # dead: never
                if not failed:
                    break
                self._tally.retried += len(failed)
                messages = [self._encode(grid, pid, self._pending[pid], self._rnd.number,
                                         attempt) for pid in failed]
                got = self._by_partition(send_and_receive(self, grid, messages, timeout))
                for pid in failed:
                    decoded[pid] = self._decode(pid, self._pending[pid].action, got.get(pid))
        if policy in ("stop", "retry-stop"):
            retries = self.max_retries if policy == "retry-stop" else 0
            stop_on_failure(self.bundle.name, self._rnd.number, decoded, retries, self.dead)
        return decoded

    # ------------------------------------------------------------------ the drivers
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int = 3,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Run ``num_rounds`` server updates; ``evaluate_fn(update, arrays)`` at each evaluation
        point (every ``eval_every`` updates and after the last), with
        ``self.round_logs[update]`` holding what happened since the previous one.

        ``timeout`` (seconds, default ``round_timeout``) bounds every exchange and is each
        message's time-to-live. Raises :class:`fedbayes_flwr.runtime.engine.RunStopped` when a
        ``stop``-policy bundle fails.
        """
        if timeout is not None:
            self.round_timeout = timeout
        timeout = self.round_timeout
        self.summary()
        self._num_updates = num_rounds
        self._t0 = time.monotonic()
        result = Result()
        self._grid = grid
        self._node_map(grid)  # before any request: failed partitions are out from the start
        if self._to_restore:  # resume: every partition gets its stored client state first
            ckpt_flower.restore_clients(self, grid)
        if self._update >= num_rounds:  # resumed at (or past) the requested number of updates
            self.outcome = "completed"
        elif self.bundle.mode(self.setup.config) == "apply-on-arrival":
            run_on_arrival(self, grid, timeout, evaluate_fn, result)
        else:
            run_barrier(self, grid, timeout, evaluate_fn, result)
        log(INFO, "%s: %d updates in %.2fs (%s)", self.bundle.name, self._update,
            time.monotonic() - self._t0, self.outcome)
        return result

    def unrecorded(self):
        """``(update, RoundLog)`` of the updates made since the last record (a run that stopped
        between two evaluation points), or ``None``; marks them recorded."""
        if self._update == self._recorded:
            return None
        self._recorded = self._update
        self.round_logs[self._update] = self._tally.log()
        return self._update, self.round_logs[self._update]

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
        ckpt_flower.after_record(self, virtual_time)
        return self.outcome is not None

    def resume(self, ckpt) -> None:
        """Continue the run stored in ``ckpt`` (a :class:`fedbayes_flwr.runtime.checkpoint.Checkpoint`):
        its server state and update number now; its client states are sent to the partitions
        when :meth:`start` begins (:func:`strategies.checkpointing.resume`)."""
        ckpt_flower.resume(self, ckpt)

    def summary(self) -> None:
        """One line: the bundle, partitions, seed and the section keys that differ from their
        defaults (settings that do not apply to this run are not listed as if they did)."""
        config = self.setup.config
        items = section_items(config)
        defaults = section_items(type(config)()) if items else {}
        changed = {k: v for k, v in items.items() if v != defaults[k]}
        log(INFO, "%s: %d partitions, seed %s, non-default keys %s", self.bundle.name,
            self.num_clients, self.run_seed, changed or "none")
