"""AsyncPVIStrategy: asynchronous PVI on the Grid's push / pull.

Every client is kept busy: all get the posterior at the start; each reply is decoded, validated and
applied the moment it is pulled (one server update, ``num-rounds`` of them), and that client at once
gets the new posterior. Nothing waits for a barrier, so a straggler's update lands whenever it
arrives. A failed or bad reply is rejected (the posterior untouched) and the client is re-sent the
current posterior. The free energy is not evaluated per update (it would need every busy client).

References
----------
Ashman et al. (2022), "Partitioned Variational Inference", Section 2.4 (asynchronous schedule).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedbayes_flwr import pvi
from fedbayes_flwr.experiment import RoundLog

from .pvi import TRAIN, PVIStrategy

POLL_S = 0.002


class AsyncPVIStrategy(PVIStrategy):
    """Asynchronous PVI; same constructor as :class:`PVIStrategy`."""

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Run ``num_rounds`` server updates; ``evaluate_fn(update, arrays)`` after each."""
        self.summary()
        result = Result()
        in_flight: dict[str, tuple[int, int]] = {}  # message id -> (partition, bytes sent)
        t0 = time.monotonic()

        def dispatch(pid: int) -> None:
            self._bytes = [0, 0]
            (message,) = self._messages(grid, [pid], pvi.KIND_TRAIN, TRAIN, lambda p: pvi.TrainRequest(
                pvi.broadcast(self.state, p, self.run_seed), self.config))
            (mid,) = grid.push_messages([message])
            in_flight[mid] = (pid, self._bytes[0])

        for pid in range(self.num_clients):
            dispatch(pid)
        update = 0
        last_arrival = time.monotonic()
        while update < num_rounds:
            replies = list(grid.pull_messages(list(in_flight)))
            if not replies:
                if time.monotonic() - last_arrival > timeout:
                    raise TimeoutError(f"asynchronous PVI: no reply for {timeout} s "
                                       f"(waiting on partitions {sorted(p for p, _ in in_flight.values())})")
                time.sleep(POLL_S)
                continue
            last_arrival = time.monotonic()
            for reply in sorted(replies, key=lambda r: in_flight[r.metadata.reply_to_message_id][0]):
                pid, sent = in_flight.pop(reply.metadata.reply_to_message_id)
                self._bytes = [sent, 0]
                info = self._apply(update + 1, [reply], [pid])
                update += 1
                self.round_logs[update] = RoundLog(None, sent, self._bytes[1], info.rejected,
                                                   info.accepted, self._prior_scale,
                                                   round(time.monotonic() - t0, 4))
                arrays = self._posterior_arrays()
                result.arrays = arrays
                if evaluate_fn is not None:
                    evaluate_fn(update, arrays)
                if update >= num_rounds:
                    break
                dispatch(pid)
        log(INFO, "Asynchronous PVI: %d updates in %.2fs; %d replies still in flight are dropped",
            update, time.monotonic() - t0, len(in_flight))
        return result
