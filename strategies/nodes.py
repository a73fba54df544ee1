"""Map Flower node ids to partition ids (ask each node once), failing fast when the connected
nodes can never cover the partitions.

Flower's node ids are random per run; every algorithm addresses clients by partition id, read
from each node's ``node_config["partition-id"]`` through a ``query.partition`` message. Each node
also reports its ``num-partitions`` (Flower's simulation sets both; a deployed SuperNode gets
them from ``--node-config``), so the server can tell "more nodes are still joining" from "this
federation was started for a different number of partitions".
"""

from __future__ import annotations

import re
import time
from logging import INFO, WARNING
from typing import NamedTuple

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

QUERY_PARTITION = "query.partition"
POLL_S = 0.5
PROGRESS_S = 10.0


class PartitionError(RuntimeError):
    """The connected nodes cannot serve the partitions; the message is one line saying how to
    start or configure them."""


def _how_to_fix(num_clients: int) -> str:
    return (f"start one SuperNode per partition (flwr run: --federation-config "
            f"\"num-supernodes={num_clients}\"; deployment: flower-supernode --node-config "
            f"\"partition-id=K num-partitions={num_clients}\" for K = 0..{num_clients - 1})")


class NodeMap(NamedTuple):
    """``nodes``: ``{partition_id: node_id}``; ``failed``: ``{partition_id: reason}`` for the
    partitions whose node answered the partition query with an error (its own message)."""

    nodes: dict[int, int]
    failed: dict[int, str]


def client_reason(reason: str) -> str:
    """A ClientApp's error as one line: ``ValueError: ...`` (Flower wraps a deployed client's
    exception as ``<class 'ValueError'>:<'...'>``; the Simulation Engine sends a traceback)."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "unknown error"
    match = re.fullmatch(r"<class '([\w.]+)'>:<'(.*)'>", last, flags=re.S)
    return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}" if match else last


def partition_map(grid: Grid, num_clients: int, timeout: float = 600.0,
                  allowed: frozenset[int] | None = None) -> dict[int, int]:
    """``{partition_id: node_id}`` for partitions ``0..num_clients-1`` (see
    :func:`partition_nodes`; raises :class:`PartitionError` when a partition's node failed)."""
    found = partition_nodes(grid, num_clients, timeout, allowed)
    if found.failed:
        pid, reason = sorted(found.failed.items())[0]
        raise PartitionError(f"partition {pid}: {reason}")
    return found.nodes


def parse_node_ids(text: str) -> frozenset[int] | None:
    """The run-config key ``deployment-nodes`` (comma-separated node ids the run registered)
    as a set; ``None`` for ``""`` (every connected node may serve a partition)."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        return None
    try:
        ids = frozenset(int(p) for p in parts)
    except ValueError:
        raise PartitionError(f"deployment-nodes must be comma-separated node ids, got "
                             f"{text!r}") from None
    return ids


def partition_nodes(grid: Grid, num_clients: int, timeout: float = 600.0,
                    allowed: frozenset[int] | None = None) -> NodeMap:
    """Map partitions ``0..num_clients-1`` to the connected nodes.

    Polls the Grid (it can see 0 nodes at first; in deployment nodes join one by one), sends
    each new node one ``query.partition`` message (its ``partition-id`` and
    ``num-partitions``) and pulls the replies every :data:`POLL_S` seconds, logging progress
    every 10 s, for at most ``timeout`` seconds in all (``node-timeout``). A query is sent once
    and waited for as long as the whole wait lasts: a node whose ClientApp is slow to start (a
    loaded machine, Ray actors importing TensorFlow) answers late, it is not written off after
    a fixed per-query time.

    ``allowed`` (the node ids a deployment registered, run-config key ``deployment-nodes``):
    any other node the Grid lists is never sent a message; it is logged once as refused.

    A node that answers with an error (e.g. started without ``partition-id``, or its ClientApp
    cannot start) cannot say which partition it serves: once every partition has a node that
    answered, the partitions nobody claimed are *failed*, each with a node's own error (the run
    goes on without them). Raises :class:`PartitionError`, one line, when no node serves any
    partition (with the clients' own errors), when a node reports a different
    ``num-partitions`` than ``num_clients`` (it was started for another federation: no more
    nodes will come, e.g. ``flwr run``'s default 2 simulated nodes), when two nodes claim one
    partition, or after ``timeout`` (naming the nodes whose query is still unanswered).

    References
    ----------
    ../shared/FLOWER_NOTES.md, "Deployment with TLS and node authentication" (node ids are
    fixed at registration).
    """
    start = time.monotonic()
    last_log = start
    mapping: dict[int, int] = {}
    reported: dict[int, int] = {}  # node -> num-partitions in its node config
    broken: dict[int, str] = {}  # node -> its own error
    asked: set[int] = set()
    refused: set[int] = set()  # listed by the Grid, not registered by the run
    pending: dict[str, int] = {}  # query message id -> node, no reply yet
    while True:
        listed = set(grid.get_node_ids())
        if allowed is not None and listed - allowed - refused:
            rogue = sorted(listed - allowed - refused)
            refused |= set(rogue)
            log(WARNING, "refusing node(s) %s: not among the nodes this run registered %s; "
                "they get no message", rogue, sorted(allowed))
        new = sorted(n for n in listed - asked - refused)
        if new:
            asked |= set(new)
            pending.update(_ask(grid, new))
        for reply in (grid.pull_messages(list(pending)) if pending else []):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            if reply.has_error():
                broken[node] = client_reason(reply.error.reason)
                log(WARNING, "node %s could not report its partition: %s", node, broken[node])
                continue
            config = reply.content.config_records["config"]
            pid = int(config["partition-id"])
            reported[node] = int(config.get("num-partitions", num_clients))
            if pid in mapping:
                raise PartitionError(f"nodes {mapping[pid]} and {node} both claim "
                                     f"partition-id {pid}")
            mapping[pid] = node
        other = sorted({n for n in reported.values() if n != num_clients})
        if other:  # started for another number of partitions: no more nodes will come
            missing = sorted(set(range(num_clients)) - set(mapping))
            raise PartitionError(
                f"no connected node serves partition ids {_ids(missing)}: {len(reported)} "
                f"node(s) connected, started with num-partitions={other[0]}, but the run has "
                f"num-clients={num_clients}; {_how_to_fix(num_clients)}, or set num-clients="
                f"{other[0]}")
        missing = sorted(set(range(num_clients)) - set(mapping))
        if not missing:
            return NodeMap({pid: mapping[pid] for pid in range(num_clients)}, {})
        if len(broken) >= len(missing):  # every partition has a node; some nodes are broken
            if not mapping:
                node, reason = sorted(broken.items())[0]
                raise PartitionError(f"no node could report its partition (node {node}: "
                                     f"{reason}); {_how_to_fix(num_clients)}")
            reasons = [f"node {n}: {r}" for n, r in sorted(broken.items())]
            failed = {pid: reasons[i % len(reasons)] for i, pid in enumerate(missing)}
            log(WARNING, "partitions %s failed (their nodes could not report a partition: %s); "
                "the run goes on without them", _ids(missing), "; ".join(reasons))
            return NodeMap(mapping, failed)
        now = time.monotonic()
        silent = sorted(pending.values())
        if now - start > timeout:
            why = (f"; nodes that could not report a partition: "
                   f"{'; '.join(f'node {n}: {r}' for n, r in sorted(broken.items()))}"
                   if broken else "")
            why += (f"; nodes connected but never answered the partition query: "
                    f"{_ids(silent)}" if silent else "")
            why += f"; refused unregistered nodes {_ids(refused)}" if refused else ""
            raise PartitionError(f"no connected node serves partition ids {_ids(missing)} after "
                                 f"{timeout:.0f} s ({len(mapping)} of {num_clients} partitions "
                                 f"connected); {_how_to_fix(num_clients)}{why}")
        if now - last_log >= PROGRESS_S:
            log(INFO, "waiting for partitions %s: %d of %d connected after %.0f s, %d "
                "node(s) still starting their ClientApp (node-timeout %.0f s)", _ids(missing),
                len(mapping), num_clients, now - start, len(silent), timeout)
            last_log = now
        time.sleep(POLL_S)


def _ask(grid: Grid, nodes: list[int]) -> dict[str, int]:
    """Push one partition query to each node: ``{message id: node}`` (the replies are pulled
    by the caller's poll, so no per-query timeout and no ``send_and_receive`` 3 s sleeps)."""
    messages = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=node,
                        message_type=QUERY_PARTITION) for node in nodes]
    ids = list(grid.push_messages(messages))
    return dict(zip(ids, nodes, strict=True))


def _ids(ids) -> str:
    ids = sorted(ids)
    return str(ids) if len(ids) <= 6 else f"[{ids[0]}, {ids[1]}, ..., {ids[-1]}]"
