"""An experiment: data, partitions, model and prior from a :class:`RunConfig`; results on disk.

:func:`build_experiment` is called identically by the in-process engine, by Flower's ServerApp
(for the prior and the test set) and by each ClientApp (for its partition), so every engine sees
the same data. :class:`Recorder` turns a posterior into metrics and writes ``result.json``,
``posterior.npz`` and plots after every round, so a crash keeps the finished rounds.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np

from . import pvi
from .bnn import parse_hidden
from .config import RunConfig
from .data import Dataset, load_dataset, partition_indices
from .gaussian import NaturalGaussian
from .models import Model, make_model
from .vi import VIConfig


class Experiment(NamedTuple):
    config: RunConfig
    dataset: Dataset
    partitions: tuple[np.ndarray, ...]
    model: Model
    prior: NaturalGaussian
    pvi_config: pvi.PVIConfig

    @property
    def num_clients(self) -> int:
        return len(self.partitions)

    def client_data(self, partition_id: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Training rows of ``partition_id``."""
        if not 0 <= partition_id < self.num_clients:
            raise ValueError(f"partition id {partition_id} outside 0..{self.num_clients - 1}")
        idx = self.partitions[partition_id]
        y = self.dataset.y_train
        return self.dataset.x_train[idx], None if y is None else y[idx]


def pvi_config(config: RunConfig) -> pvi.PVIConfig:
    """The algorithm's hyper-parameters from the run config."""
    cavity = {"bcm-same": "same-prior", "bcm-split": "split-prior", "vcl": "no-deletion",
              "streaming-vb": "no-deletion",
              "streaming-vb-no-deletion": "no-deletion"}.get(config.algorithm, "pvi")
    return pvi.PVIConfig(
        damping=config.damping, schedule=config.schedule,
        vi=VIConfig(config.local_steps, config.learning_rate, config.mc_samples,
                    config.batch_size),
        server_damping=config.server_damping, cavity=cavity,
        local_optimiser=config.local_optimiser,
        fixed_point_iterations=config.fixed_point_iterations, local_damping=config.local_damping)


@functools.lru_cache(maxsize=8)
def build_experiment(config: RunConfig) -> Experiment:
    """Load data, split it, make the model and prior. Cached: ClientApps call it every round.

    ``global-vi`` is PVI with a single client holding all training data (M = 1).
    """
    dataset = load_dataset(config.dataset, config.model, seed=config.seed,
                           test_fraction=config.test_fraction, data_file=config.data,
                           synthetic_size=config.synthetic_size,
                           synthetic_dim=config.synthetic_dim, noise_scale=config.noise_scale)
    if config.algorithm == "global-vi":
        partitions = (np.arange(dataset.x_train.shape[0]),)
    else:
        partitions = tuple(partition_indices(
            dataset, config.num_clients, config.partition, alpha=config.partition_alpha,
            classes_per_client=config.partition_classes, seed=config.seed))
    model = make_model(config.model, config.noise_scale, parse_hidden(config.hidden_layers),
                       num_classes(dataset))
    diag = config.covariance == "diag" or (config.covariance == "auto" and model.mean_field_only)
    prior = model.prior(dataset.x_train.shape[1], config.prior_scale, diag)
    return Experiment(config, dataset, partitions, model, prior, pvi_config(config))


def num_classes(dataset: Dataset) -> int:
    """Number of classes of integer-labelled data (1 for regression / no labels)."""
    y = dataset.y_train
    if y is None or not np.issubdtype(y.dtype, np.integer):
        return 1
    return int(max(y.max(), dataset.y_test.max() if dataset.y_test is not None else 0)) + 1


def payload_nbytes(obj) -> int:
    """Bytes of array payload in a message (NamedTuples of arrays, nested)."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, tuple):
        return sum(payload_nbytes(o) for o in obj)
    return 0


def corrupt_reply(kind: str, reply: pvi.ClientMessage,
                  posterior: NaturalGaussian) -> pvi.ClientMessage:
    """Testing hook behind ``inject-fault``: turn a good reply into a bad one.

    ``nan`` fills the delta with NaN; ``negative-precision`` returns a delta that makes the
    posterior precision negative definite. (``error`` and ``drop`` are handled by the engines: the
    client fails, or its reply never arrives.)
    """
    if kind == "nan":
        return reply._replace(delta=NaturalGaussian(np.full_like(reply.delta.eta1, np.nan),
                                                    reply.delta.eta2))
    if kind == "negative-precision":
        return reply._replace(delta=NaturalGaussian(reply.delta.eta1, -2.0 * posterior.eta2))
    raise ValueError(f"corrupt_reply cannot make a {kind!r} fault")


def active_fault(config: RunConfig, server_round: int, partition_id: int) -> str | None:
    """The fault kind injected into this client's reply this round, if any."""
    from .config import parse_fault

    fault = parse_fault(config.inject_fault)
    if fault and fault[1] == server_round and fault[2] == partition_id:
        return fault[0]
    return None


class RoundLog(NamedTuple):
    """What an engine reports about one round (one server update) besides the posterior."""

    log_marginal_likelihood: float | None
    bytes_down: int
    bytes_up: int
    rejected: tuple[pvi.Rejection, ...]
    clients: tuple[int, ...]
    prior_scale: float | None = None
    virtual_time: float | None = None


class Recorder:
    """Metrics per round from the posterior interface; ``result.json`` written as the run goes."""

    def __init__(self, experiment: Experiment, engine: str, output_dir: str | None = None,
                 progress: bool = True):
        self.exp = experiment
        self.engine = engine
        self.output_dir = output_dir or experiment.config.output_dir
        os.makedirs(self.output_dir, exist_ok=True)
        self.history: list[dict] = []
        self.t0 = time.perf_counter()
        self.posterior = None
        self._progress = _Progress(experiment.config.num_rounds, enabled=progress)

    def record(self, server_round: int, posterior, log: RoundLog) -> dict:
        """Evaluate ``posterior`` on the test set, append the round, rewrite the result files."""
        ds = self.exp.dataset
        metrics, diagram = self.exp.model.metrics(posterior, ds.x_test, ds.y_test)
        row = {"round": server_round, **metrics,
               "log_marginal_likelihood": log.log_marginal_likelihood,
               "bytes_down": log.bytes_down, "bytes_up": log.bytes_up,
               "elapsed_s": round(time.perf_counter() - self.t0, 4),
               "rejected_replies": len(log.rejected),
               "clients": list(log.clients)}
        if log.rejected:
            row["rejections"] = [r._asdict() for r in log.rejected]
        if log.prior_scale is not None:
            row["prior_scale"] = log.prior_scale
        if log.virtual_time is not None:
            row["virtual_time"] = log.virtual_time
        self.history.append(row)
        self.posterior = posterior
        self._diagram = diagram
        self._write()
        self._progress.update(server_round, row)
        return row

    def _write(self) -> None:
        c = self.exp.config
        posterior_file = "posterior.npz"
        self.posterior.save(os.path.join(self.output_dir, posterior_file))
        final = {k: v for k, v in self.history[-1].items() if k not in ("clients", "rejections")}
        if c.optimise_prior:
            final["learned_prior_scale"] = self.history[-1]["prior_scale"]
        result = {"algorithm": c.algorithm, "model": c.model,
                  "dataset": self.exp.dataset.name, "num_clients": self.exp.num_clients,
                  "seed": c.seed, "engine": self.engine, "run_config": c.to_run_config(),
                  "history": self.history, "final": final, "posterior_file": posterior_file}
        write_json(os.path.join(self.output_dir, "result.json"), result)

    def finish(self) -> dict:
        """Write the plots and close the progress display; return the last round's row."""
        from .plots import plot_history, plot_reliability

        self._progress.close()
        title = f"{self.exp.config.algorithm} / {self.exp.config.model} / {self.exp.dataset.name}"
        plot_history(self.history, os.path.join(self.output_dir, "metrics.png"), title)
        if self._diagram is not None:
            plot_reliability(self._diagram, os.path.join(self.output_dir, "reliability.png"),
                             title)
        return self.history[-1]


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON atomically (temp file + rename: a crash never leaves half a file);
    numpy scalars become Python numbers. Used for result.json and the benchmarks' JSON."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")


class _Progress:
    """A rich progress bar on a terminal; one plain line per round otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        self.bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(stderr=True)
        if console.is_terminal:
            self.bar = Progress(TextColumn("round"), MofNCompleteColumn(), BarColumn(),
                                TextColumn("{task.description}"), console=console)
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def update(self, server_round: int, row: dict) -> None:
        if not self.enabled:
            return
        shown = {k: row[k] for k in ("test_accuracy", "test_nll", "test_rmse",
                                     "log_marginal_likelihood", "rejected_replies")
                 if row.get(k) is not None}
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in shown.items())
        if self.bar is not None:
            self.bar.update(self.task, completed=server_round, description=text)
        else:
            print(f"round {server_round}: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_in_process(config: RunConfig, output_dir: str | None = None,
                   progress: bool = True) -> dict:
    """Run PVI / global VI without Flower; same seeds, same maths, same result files.

    Returns the ``result.json`` content.
    """
    exp = build_experiment(config)
    recorder = Recorder(exp, "in-process", output_dir, progress)
    for server_round, state, log in iterate_in_process(exp):
        recorder.record(server_round, _posterior(state), log)
    recorder.finish()
    with open(os.path.join(recorder.output_dir, "result.json")) as f:
        return json.load(f)


def iterate_in_process(exp: Experiment, num_rounds: int | None = None):
    """Yield ``(server_round, server_state, RoundLog)`` after every server update.

    Mirrors :class:`strategies.PVIStrategy` message for message: the same selections, seeds, faults,
    replies applied in partition order, and the free-energy evaluation after each round. The
    asynchronous schedule runs on a virtual clock (:func:`iterate_async`).
    """
    if exp.pvi_config.schedule == "asynchronous":
        yield from iterate_async(exp, num_rounds)
        return
    config = exp.config
    state = pvi.init_server(exp.prior, exp.num_clients)
    clients = {k: pvi.init_client(exp.prior) for k in range(exp.num_clients)}
    for server_round in range(1, (num_rounds or config.num_rounds) + 1):
        selected = pvi.select_clients(config.seed, server_round, exp.num_clients,
                                      exp.pvi_config.schedule)
        replies, down, up = [], 0, 0
        for pid in selected:
            message = pvi.broadcast(state, pid, config.seed)
            down += payload_nbytes(message)
            reply = _client_reply(exp, clients, pid, message)
            up += payload_nbytes(reply)
            replies.append((pid, reply))
        state, info = pvi.server_step(state, replies, exp.pvi_config.server_damping)
        state, scale = _maybe_optimise_prior(exp, state)
        lml, d2, u2 = evaluate_in_process(exp, state, clients)
        yield server_round, state, RoundLog(lml, down + d2, up + u2, info.rejected, info.accepted,
                                            scale)


def _client_reply(exp: Experiment, clients: dict, pid: int, message: pvi.ServerMessage):
    """One client's reply (or the :class:`pvi.Rejection` a failed client amounts to)."""
    fault = active_fault(exp.config, message.server_round, pid)
    if fault in ("error", "drop"):
        return pvi.Rejection(pid, "reply", f"client failed ({fault})")
    x, y = exp.client_data(pid)
    clients[pid], reply = pvi.client_step(clients[pid], message, exp.model, x, y, exp.pvi_config,
                                          exp.prior, exp.num_clients)
    return corrupt_reply(fault, reply, message.posterior) if fault else reply


def _maybe_optimise_prior(exp: Experiment, state: pvi.ServerState):
    if not exp.config.optimise_prior:
        return state, None
    return pvi.optimise_prior_scale(state)


def client_durations(config: RunConfig, num_clients: int) -> np.ndarray:
    """Time one update takes on each client: ``client-delay`` (or 1 virtual unit when 0) times
    ``straggler-factor`` for the partitions listed in ``stragglers``."""
    from .config import straggler_ids

    base = config.client_delay if config.client_delay > 0 else 1.0
    durations = np.full(num_clients, base)
    for k in straggler_ids(config):
        durations[k] *= config.straggler_factor
    return durations


def client_delay_s(config: RunConfig, partition_id: int) -> float:
    """Seconds a real client waits before each update (0 unless ``client-delay`` > 0)."""
    if config.client_delay <= 0:
        return 0.0
    return float(client_durations(config, config.num_clients)[partition_id])


def iterate_async(exp: Experiment, num_rounds: int | None = None):
    """Asynchronous PVI on a virtual clock: every client is always busy; each reply is applied
    the moment it arrives and that client at once gets the new posterior (Ashman et al. 2022,
    Section 2.4, asynchronous schedule). Client ``k`` takes :func:`client_durations` ``[k]``;
    ties resolve by partition id. One yielded round = one server update. The free energy is not
    evaluated per update (it would need every busy client): ``log_marginal_likelihood`` is None.
    """
    import heapq

    config = exp.config
    durations = client_durations(config, exp.num_clients)
    state = pvi.init_server(exp.prior, exp.num_clients)
    clients = {k: pvi.init_client(exp.prior) for k in range(exp.num_clients)}
    queue, pending_bytes = [], {}

    def dispatch(pid: int, now: float) -> None:
        message = pvi.broadcast(state, pid, config.seed)
        reply = _client_reply(exp, clients, pid, message)
        pending_bytes[pid] = (payload_nbytes(message), payload_nbytes(reply))
        heapq.heappush(queue, (now + durations[pid], pid, reply))

    for pid in range(exp.num_clients):
        dispatch(pid, 0.0)
    for server_round in range(1, (num_rounds or config.num_rounds) + 1):
        now, pid, reply = heapq.heappop(queue)
        state, info = pvi.server_step(state, [(pid, reply)], exp.pvi_config.server_damping)
        state, scale = _maybe_optimise_prior(exp, state)
        down, up = pending_bytes.pop(pid)
        yield server_round, state, RoundLog(None, down, up, info.rejected, info.accepted, scale,
                                            float(now))
        dispatch(pid, now)


def evaluate_in_process(exp: Experiment, state: pvi.ServerState, clients: dict):
    """Global free energy from every client's term; returns (value, bytes down, bytes up)."""
    terms, down, up = [], 0, 0
    for pid in range(exp.num_clients):
        message = pvi.EvalMessage(state.posterior, int(state.accepted_round[pid]))
        down += payload_nbytes(message)
        x, y = exp.client_data(pid)
        clients[pid], term = pvi.free_energy_term(clients[pid], message.posterior,
                                                  message.accepted_round, exp.model, x, y)
        terms.append(term)
        up += payload_nbytes(pvi.EvalReply(np.asarray([term], dtype=np.float64)))
    return pvi.log_marginal_likelihood(state, terms), down, up


def _posterior(state: pvi.ServerState):
    from .posterior import GaussianPosterior

    return GaussianPosterior(state.posterior)
