"""Map Flower node ids to partition ids (ask each node once), failing fast when the connected
nodes can never cover the partitions.

Flower's node ids are random per run; every algorithm addresses clients by partition id, read
from each node's ``node_config["partition-id"]`` through a ``query.partition`` message. Each node
also reports its ``num-partitions`` (Flower's simulation sets both; a deployed SuperNode gets
them from ``--node-config``), so the server can tell "more nodes are still joining" from "this
federation was started for a different number of partitions".
"""

from __future__ import annotations

import time
from logging import INFO

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


def partition_map(grid: Grid, num_clients: int, timeout: float = 600.0,
                  query_timeout: float = 120.0) -> dict[int, int]:
    """Return ``{partition_id: node_id}`` for partitions ``0..num_clients-1``.

    Polls the Grid (it can see 0 nodes at first; in deployment nodes join one by one), asks each
    new node its ``partition-id`` and ``num-partitions``, and logs progress every 10 s while it
    waits, for at most ``timeout`` seconds. Fails at once, with one line, when a node reports a
    different ``num-partitions`` than ``num_clients`` (it was started for another federation:
    no more nodes will come, e.g. ``flwr run``'s default 2 simulated nodes) or when a node's
    own answer is an error (e.g. it lacks ``partition-id``).
    """
    start = time.monotonic()
    last_log = start
    mapping: dict[int, int] = {}
    reported: dict[int, int] = {}  # node -> num-partitions in its node config
    asked: set[int] = set()
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            messages = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=node,
                                message_type=QUERY_PARTITION) for node in new]
            asked |= set(new)
            for reply in grid.send_and_receive(messages, timeout=query_timeout):
                node = reply.metadata.src_node_id
                if reply.has_error():
                    reason = reply.error.reason.strip().splitlines()[-1]
                    raise PartitionError(f"node {node} could not report its partition: {reason}")
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
            return {pid: mapping[pid] for pid in range(num_clients)}
        now = time.monotonic()
        if now - start > timeout:
            raise PartitionError(f"no connected node serves partition ids {_ids(missing)} after "
                                 f"{timeout:.0f} s ({len(mapping)} of {num_clients} partitions "
                                 f"connected); {_how_to_fix(num_clients)}")
        if now - last_log >= PROGRESS_S:
            log(INFO, "waiting for partitions %s: %d of %d connected after %.0f s (node-timeout "
                "%.0f s)", _ids(missing), len(mapping), num_clients, now - start, timeout)
            last_log = now
        time.sleep(POLL_S)


def _ids(ids) -> str:
    ids = sorted(ids)
    return str(ids) if len(ids) <= 6 else f"[{ids[0]}, {ids[1]}, ..., {ids[-1]}]"
