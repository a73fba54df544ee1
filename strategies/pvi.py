"""PVIStrategy: partitioned variational inference as a Flower Message-API strategy.

Transport only: every update rule lives in :mod:`fedbayes_flwr.pvi`. Each round

1. ``configure_train`` sends ``train.pvi`` (the posterior, the round's seed, the ack of the
   client's last delta, the hyper-parameters) to the partitions the schedule selects;
2. ``aggregate_train`` decodes and validates each reply; replies are applied in partition order;
   a bad reply (client error, undecodable, non-finite, or breaking the posterior's precision) is
   rejected with a log line naming node, partition and field, and counted;
3. ``configure_evaluate`` / ``aggregate_evaluate`` collect every client's free-energy term
   (``evaluate.pvi``) and sum them into the log marginal likelihood estimate.

Use from another Flower app::

    from strategies import PVIStrategy
    strategy = PVIStrategy(prior, num_clients=10, run_seed=0)
    strategy.start(grid, strategy.initial_arrays(), num_rounds=10)
    strategy.posterior  # a fedbayes_flwr.posterior.GaussianPosterior

References
----------
Ashman et al. (2022), "Partitioned Variational Inference", Algorithm 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedbayes_flwr import codec, pvi
from fedbayes_flwr.experiment import RoundLog, payload_nbytes
from fedbayes_flwr.gaussian import NaturalGaussian
from fedbayes_flwr.posterior import GaussianPosterior

from .nodes import partition_map

TRAIN, EVALUATE = "train.pvi", "evaluate.pvi"


class PVIStrategy(Strategy):
    """Synchronous / sequential PVI over Flower.

    Parameters
    ----------
    prior : NaturalGaussian
        The prior; its shape (full or diagonal covariance) fixes every message's shape.
    num_clients : int
        Number of partitions ``M``; nodes are matched to partitions by ``partition-id``.
    run_seed : int
        Seed of the run; per-client seeds derive from it, the round and the partition id.
    config : fedbayes_flwr.pvi.PVIConfig
        Damping, schedule and local optimiser settings, sent to clients every round.
    optimise_prior : bool
        Learn the prior scale by maximising the free energy after every update.
    """

    def __init__(self, prior: NaturalGaussian, num_clients: int, run_seed: int = 0,
                 config: pvi.PVIConfig | None = None, optimise_prior: bool = False):
        self.state = pvi.init_server(prior, num_clients)
        self.num_clients = num_clients
        self.run_seed = run_seed
        self.config = config or pvi.PVIConfig()
        self.nodes: dict[int, int] | None = None
        self._bytes = [0, 0]
        self._rejected: list[pvi.Rejection] = []
        self._accepted: tuple[int, ...] = ()
        self._prior_scale: float | None = None
        self.optimise_prior = optimise_prior
        self.round_logs: dict[int, RoundLog] = {}

    # ------------------------------------------------------------------ helpers
    @property
    def posterior(self) -> GaussianPosterior:
        return GaussianPosterior(self.state.posterior)

    def initial_arrays(self) -> ArrayRecord:
        return self._posterior_arrays()

    def _posterior_arrays(self) -> ArrayRecord:
        return codec.encode(self.state.posterior, "pvi.posterior").array_records["arrays"]

    def _node_map(self, grid: Grid) -> dict[int, int]:
        if self.nodes is None:
            self.nodes = partition_map(grid, self.num_clients)
            self.partition_of = {node: pid for pid, node in self.nodes.items()}
        return self.nodes

    def _messages(self, grid: Grid, pids, kind: str, message_type: str, make) -> list[Message]:
        nodes = self._node_map(grid)
        out = []
        for pid in pids:
            body = make(pid)
            self._bytes[0] += payload_nbytes(body)
            content = codec.encode(body, kind)
            out.append(Message(content, dst_node_id=nodes[pid], message_type=message_type))
        return out

    def _decode_replies(self, replies: Iterable[Message], kind: str, template, expected):
        """Yield ``(pid, decoded | Rejection)`` for every expected partition."""
        seen = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            pid = self.partition_of.get(node)
            if pid is None or pid not in expected:
                log(WARNING, "PVI: ignoring a reply from unexpected node %s", node)
                continue
            if reply.has_error():
                seen[pid] = pvi.Rejection(pid, "reply", f"client error: {reply.error.reason}")
            else:
                self._bytes[1] += codec.received_nbytes(reply.content)
                try:
                    seen[pid] = codec.decode(reply.content, kind, template)
                except codec.CodecError as err:
                    seen[pid] = pvi.Rejection(pid, err.field, err.reason)
        for pid in expected:
            yield pid, seen.get(pid, pvi.Rejection(pid, "reply", "no reply before the timeout"))

    # ------------------------------------------------------------------ Strategy API
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._bytes = [0, 0]
        self._selected = pvi.select_clients(self.run_seed, server_round, self.num_clients,
                                            self.config.schedule)
        return self._messages(grid, self._selected, pvi.KIND_TRAIN, TRAIN,
                              lambda pid: pvi.TrainRequest(
                                  pvi.broadcast(self.state, pid, self.run_seed), self.config))

    def _apply(self, server_round: int, replies: Iterable[Message], expected) -> pvi.ServerInfo:
        """Decode, validate and apply replies (one server update); log rejections."""
        template = pvi.ClientMessage(self.state.posterior, 0, 0)
        decoded = list(self._decode_replies(replies, pvi.KIND_REPLY, template, expected))
        self.state, info = pvi.server_step(self.state, decoded, self.config.server_damping)
        if self.optimise_prior:
            self.state, self._prior_scale = pvi.optimise_prior_scale(self.state)
        for r in info.rejected:
            log(WARNING, "PVI round %s: rejected reply of partition %s (node %s), field %s: %s",
                server_round, r.partition_id, self.nodes[r.partition_id], r.field, r.reason)
        self._rejected, self._accepted = list(info.rejected), info.accepted
        return info

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        info = self._apply(server_round, replies, self._selected)
        metrics = MetricRecord({"rejected-replies": len(info.rejected),
                                "accepted-replies": len(info.accepted)})
        return self._posterior_arrays(), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self._messages(
            grid, range(self.num_clients), pvi.KIND_EVAL, EVALUATE,
            lambda pid: pvi.EvalMessage(self.state.posterior,
                                        int(self.state.accepted_round[pid])))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        template = pvi.EvalReply(np.zeros(1, np.float64))
        terms = list(self._decode_replies(replies, pvi.KIND_TERM, template, range(self.num_clients)))
        missing = [t for _, t in terms if isinstance(t, pvi.Rejection)]
        lml = (None if missing else
               pvi.log_marginal_likelihood(self.state, [float(t.term[0]) for _, t in terms]))
        self.round_logs[server_round] = RoundLog(lml, self._bytes[0], self._bytes[1],
                                                 tuple(self._rejected), self._accepted,
                                                 self._prior_scale)
        return MetricRecord({} if lml is None else {"log-marginal-likelihood": lml})

    def summary(self) -> None:
        log(INFO, "\t├── PVI: %d clients, schedule %s, damping %s, seed %s", self.num_clients,
            self.config.schedule, self.config.damping, self.run_seed)
        log(INFO, "\t└── local optimiser: %s", dict(self.config.vi._asdict()))
