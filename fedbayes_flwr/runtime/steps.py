"""The steps both engines share (the in-process engine and the Flower strategy), so the glue adds
no maths: :func:`client_work` (one client's step, with fault injection), :func:`judge` (structural
validation + the bundle's invariant), :class:`Tally` and :class:`RoundLog` (what a history row
reports), :func:`eval_point`, the failure policy's stop and the run's outcome, and the stop flag
the CLI's Ctrl-C sets (:func:`request_stop`, :func:`check_stop`).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from fedbayes_flwr.algorithms.base import Rejection, client_seed
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.runtime.experiment import Experiment
from fedbayes_flwr.runtime.faults import RAISED, InjectedFault, active_fault, corrupt
from fedbayes_flwr.runtime.validation import check_message

_STOP = threading.Event()


class Interrupted(RuntimeError):
    """The user asked the run to stop (Ctrl-C): raised between steps, never inside one."""


def request_stop() -> None:
    """Ask every engine in this process to stop at the next step boundary (the CLI's Ctrl-C)."""
    _STOP.set()


def clear_stop() -> None:
    _STOP.clear()


def check_stop() -> None:
    """Raise :class:`Interrupted` if :func:`request_stop` was called."""
    if _STOP.is_set():
        raise Interrupted("interrupted by the user")


class RoundLog(NamedTuple):
    """What an engine reports about the updates since the last history row."""

    metrics: dict
    bytes_down: int
    bytes_up: int
    rejected: tuple
    clients: tuple
    virtual_time: float | None = None
    diagnostics: dict = {}
    exchanges: int = 0
    outcome: str | None = None
    retried: int = 0

    @property
    def log_marginal_likelihood(self):
        return self.metrics.get("log_marginal_likelihood")

    @property
    def prior_scale(self):
        return self.metrics.get("prior_scale")


class Tally:
    """Accumulates bytes, rejections, accepted clients and metrics between two history rows."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.down = self.up = self.exchanges = self.retried = 0
        self.rejected: list = []
        self.clients: list = []
        self.metrics: dict = {}
        self.diagnostics: dict = {}

    def add(self, info) -> None:
        self.exchanges += 1
        self.rejected += list(info.rejected)
        self.clients += list(info.accepted)
        self.metrics.update(info.metrics)
        self.diagnostics.update(info.diagnostics)

    def log(self, virtual_time: float | None = None) -> RoundLog:
        out = RoundLog(dict(self.metrics), self.down, self.up, tuple(self.rejected),
                       tuple(self.clients), virtual_time, dict(self.diagnostics), self.exchanges,
                       retried=self.retried)
        self.reset()
        return out


def eval_point(update: int, eval_every: int, num_updates: int) -> bool:
    """Whether the engine records once update ``update`` is complete."""
    return update % eval_every == 0 or update >= num_updates


def client_work(exp: Experiment, state, partition_id: int, request, number: int, attempt: int = 0,
                previous: int | None = None):
    """One client's step for ``request`` (update ``number``): ``(client_state, reply)``.

    Applies ``inject-fault``: raises :class:`InjectedFault` for ``error``, ``drop``,
    ``raise-always`` and ``hang`` (the Flower handler sleeps on ``hang`` before raising);
    corrupts the reply for the other kinds (the client state is kept, as a real faulty client
    would). ``previous``: the update of this partition's previous train request
    (:func:`~fedbayes_flwr.runtime.faults.active_fault`).
    """
    spec = exp.actions[request.action]
    fault = active_fault(exp.config, number, partition_id, spec.category, attempt, previous)
    if fault in RAISED:
        raise InjectedFault(fault)
    seed = client_seed(exp.config.seed, exp.bundle.name, request.action, number, partition_id,
                       attempt)
    state, reply, _ = exp.bundle.client_step(seed, state, request, exp.client_data(partition_id),
                                             exp.setup)
    if fault:
        reply = corrupt(exp.bundle, fault, reply, request)
    return state, reply


def judge(bundle, setup, actions, server_state, partition_id: int, action: str, reply):
    """The reply, or the :class:`Rejection` it earns: the action's template (shape, dtype,
    per-field finiteness) then the bundle's invariant. Both engines call this."""
    spec = actions[action]
    problem = check_message(spec.reply, reply, spec.allow_inf)
    if problem is None:
        problem = bundle.check(server_state, setup, action, reply)
    return reply if problem is None else Rejection(partition_id, *problem)


def timed_out(partition_id: int, timeout: float) -> Rejection:
    """The :class:`Rejection` of a request with no reply within ``round-timeout``: the engine
    then marks the partition dead (no further messages this run). Both engines use it."""
    return Rejection(partition_id, "reply", f"no reply within round-timeout ({timeout:g} s)")


def not_sent(partition_id: int) -> Rejection:
    """The :class:`Rejection` standing for a request to a dead partition (never sent)."""
    return Rejection(partition_id, "reply", "timed out earlier in this run; not sent")


def stop_on_failure(bundle_name: str, number: int, replies: dict, retries: int = 0,
                    dead=frozenset()) -> None:
    """Raise :class:`RunStopped` naming the first failed partition, if any (``stop`` policy);
    ``retries``: re-sends made to each failed partition that is not ``dead`` (timed out)."""
    failed = [r for r in replies.values() if isinstance(r, Rejection)]
    if failed:
        r = failed[0]
        after = f" after {retries} retries" if retries and r.partition_id not in dead else ""
        raise RunStopped(f"update {number}: partition {r.partition_id} failed ({r.field}: "
                         f"{r.reason}){after}; the {bundle_name} bundle stops on failures")


def outcome(bundle, setup, state, finished: bool, elapsed_s: float,
            max_seconds: float) -> str | None:
    """At an evaluation point: None to go on, else why the run ends here (``completed``,
    ``done`` by the bundle's rule, or ``time-limit``). Both engines call this."""
    if finished:
        return "completed"
    if bundle.done(state, setup):
        return "done"
    if max_seconds and elapsed_s >= max_seconds:
        return "time-limit"
    return None
