"""Map Flower node ids to partition ids (ask each node once).

Flower's node ids are random per run; every algorithm addresses clients by partition id, read
from each node's ``node_config["partition-id"]`` through a ``query.partition`` message.
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

QUERY_PARTITION = "query.partition"


def partition_map(grid: Grid, num_clients: int, timeout: float = 600.0) -> dict[int, int]:
    """Return ``{partition_id: node_id}`` for partitions ``0..num_clients-1``.

    Waits (up to ``timeout`` s) for enough nodes to connect, as in deployment they join one by one.
    Raises ``RuntimeError`` naming the missing partitions if the federation does not cover them.
    """
    deadline = time.monotonic() + timeout
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < num_clients and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = list(grid.get_node_ids())
    messages = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=node,
                        message_type=QUERY_PARTITION) for node in node_ids]
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        if reply.has_error():
            continue
        pid = int(reply.content.config_records["config"]["partition-id"])
        if pid in mapping:
            raise RuntimeError(f"nodes {mapping[pid]} and {reply.metadata.src_node_id} both "
                               f"claim partition-id {pid}")
        mapping[pid] = reply.metadata.src_node_id
    missing = sorted(set(range(num_clients)) - set(mapping))
    if missing:
        raise RuntimeError(f"no connected node serves partition ids {missing} "
                           f"({len(node_ids)} nodes connected, {num_clients} partitions needed)")
    return {pid: mapping[pid] for pid in range(num_clients)}
