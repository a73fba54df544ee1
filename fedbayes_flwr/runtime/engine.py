"""The generic in-process engine: runs any algorithm bundle without Flower, on the same seeds.

Two modes, chosen by the bundle (:attr:`fedbayes_flwr.algorithms.base.Bundle.mode`):

* ``barrier``: each exchange sends the bundle's requests, collects every reply (in partition
  order), then makes one server step;
* ``apply-on-arrival``: every idle client gets a request; replies land on a virtual clock
  (client ``k`` takes :func:`fedbayes_flwr.runtime.faults.client_durations` ``[k]``; ties by partition
  id) and each is applied alone, after which ``requests`` is asked again with that client idle.

The pieces the Flower glue shares (so the glue adds no maths): :func:`client_work` (one client's
step, with fault injection), :func:`judge` (structural validation + the bundle's invariant),
:class:`Tally` (what a history row reports) and :func:`eval_point`.

Results are recorded at *evaluation points*: after every ``eval-every``-th update once the
bundle says the update is settled, and always after the last one; ``done(state)`` and
``max-seconds`` are checked there.
"""

from __future__ import annotations

import heapq
import json
import os
import threading
import time
from typing import NamedTuple

from fedbayes_flwr.algorithms.base import Rejection, Round, client_seed, failure_policy, round_seed
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.runtime.checkpoint import check_client_count, check_fits, resumed
from fedbayes_flwr.runtime.experiment import Experiment, build_experiment, payload_nbytes
from fedbayes_flwr.runtime.faults import RAISED, InjectedFault, active_fault, client_durations, corrupt
from fedbayes_flwr.runtime.recorder import Recorder
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


def client_work(exp: Experiment, state, partition_id: int, request, number: int, attempt: int = 0):
    """One client's step for ``request`` (update ``number``): ``(client_state, reply)``.

    Applies ``inject-fault``: raises :class:`InjectedFault` for ``error``, ``drop``,
    ``raise-always`` and ``hang`` (the Flower handler sleeps on ``hang`` before raising);
    corrupts the reply for the other kinds (the client state is kept, as a real faulty client
    would).
    """
    spec = exp.actions[request.action]
    fault = active_fault(exp.config, number, partition_id, spec.category, attempt)
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


class _InProcess:
    """Client states and the client side of the in-process engine; ``dead``: partitions that
    timed out (``hang``), which get no further requests."""

    def __init__(self, exp: Experiment):
        self.exp = exp
        self.clients = {pid: exp.bundle.init_client(exp.setup, pid) for pid in range(exp.num_clients)}
        self.dead: set[int] = set()

    def reply(self, server_state, pid: int, request, number: int, attempt: int, tally: Tally,
              judged: bool = True):
        """The client's reply (or Rejection); ``judged`` validates it against ``server_state``
        now (barrier), else the caller judges it against the state it lands on (arrival)."""
        if pid in self.dead:
            return not_sent(pid)
        tally.down += payload_nbytes(request.message)
        try:
            self.clients[pid], reply = client_work(self.exp, self.clients[pid], pid, request,
                                                   number, attempt)
        except InjectedFault as err:
            if err.kind == "hang":  # the reply that never comes: the timeout, without waiting
                self.dead.add(pid)
                return timed_out(pid, self.exp.config.round_timeout)
            return Rejection(pid, "reply", f"client failed ({err.kind})")
        tally.up += payload_nbytes(reply)
        if not judged:
            return reply
        exp = self.exp
        return judge(exp.bundle, exp.setup, exp.actions, server_state, pid, request.action, reply)


def iterate_in_process(exp: Experiment, num_rounds: int | None = None, *, resume=None,
                       on_record=None):
    """Yield ``(update, server_state, RoundLog)`` at every evaluation point of the run.

    ``num_rounds`` overrides ``num-rounds`` (the number of server updates). ``resume`` (a
    :class:`fedbayes_flwr.runtime.checkpoint.Checkpoint`) continues a stored run from its update, server
    and client states, with the partitions it had left out (timed out) still out.
    ``on_record(update, server_state, client_states, virtual_time, dead)`` is called once the
    caller has handled each yielded row (the checkpoint hook; ``dead``: the partitions left
    out, sorted), before the engine goes on or returns.
    """
    num_updates = num_rounds or exp.config.num_rounds
    if exp.bundle.mode(exp.setup.config) == "apply-on-arrival":
        yield from _iterate_on_arrival(exp, num_updates, resume, on_record)
    else:
        yield from _iterate_barrier(exp, num_updates, resume, on_record)


def _start(exp: Experiment, resume):
    """``(server_state, client side, update)`` of a fresh run or of the checkpoint ``resume``."""
    side = _InProcess(exp)
    if resume is None:
        return exp.bundle.init_server(exp.setup), side, 0

    check_client_count(resume, exp.num_clients)
    side.clients = dict(enumerate(resume.client_states))
    side.dead = {int(p) for p in resume.counters.get("dead", ())}  # still out, as over Flower
    return resume.server_state, side, resume.update


def _checkpoint(on_record, update, state, side, virtual_time=None) -> None:
    if on_record is not None:
        on_record(update, state, tuple(side.clients[p] for p in sorted(side.clients)),
                  virtual_time, tuple(sorted(side.dead)))


def _iterate_barrier(exp: Experiment, num_updates: int, resume=None, on_record=None):
    bundle, setup, config = exp.bundle, exp.setup, exp.config
    state, side, update = _start(exp, resume)
    everyone = frozenset(range(exp.num_clients))
    tally, t0 = Tally(), time.perf_counter()
    step, settled, recorded = 0, True, update
    if update >= num_updates:  # resumed at (or past) the requested number of updates
        return
    while True:
        check_stop()
        number = update + 1 if settled else update
        step = 0 if settled else step + 1
        rnd = Round(number, step, round_seed(config.seed, bundle.name, number, step), everyone,
                    eval_point(number, config.eval_every, num_updates))
        requests = bundle.requests(state, setup, rnd)
        replies = {pid: side.reply(state, pid, req, number, 0, tally)
                   for pid, req in sorted(requests.items())}
        try:
            replies = _apply_policy(exp, state, side, requests, replies, number, tally)
            state, info = bundle.server_step(state, sorted(replies.items()), setup, rnd)
        except RunStopped as err:
            err.state = state  # the caller saves what was computed before the failure
            raise
        update += info.updates
        settled = info.settled
        tally.add(info)
        if not settled or update == recorded:
            continue
        finished = update >= num_updates
        if eval_point(update, config.eval_every, num_updates) or finished:
            outcome, recorded = _outcome(exp, state, t0, finished), update
            yield update, state, tally.log()._replace(outcome=outcome)
            _checkpoint(on_record, update, state, side)
            if outcome is not None:
                return


def _apply_policy(exp, state, side, requests, replies, number, tally):
    """Failure policy: ``retry`` re-sends failed requests with fresh attempt seeds (up to
    ``max-retries``), ``stop`` raises :class:`RunStopped`, ``retry-stop`` does both in that order,
    ``reject`` goes on."""
    policy = failure_policy(exp.bundle, exp.setup.config)
    if policy in ("retry", "retry-stop"):
        for attempt in range(1, exp.config.max_retries + 1):
            failed = [pid for pid, r in replies.items()
                      if isinstance(r, Rejection) and pid not in side.dead]  # dead: never again
            tally.retried += len(failed)
            for pid in failed:
                replies[pid] = side.reply(state, pid, requests[pid], number, attempt, tally)
    if policy in ("stop", "retry-stop"):
        retries = exp.config.max_retries if policy == "retry-stop" else 0
        stop_on_failure(exp.bundle.name, number, replies, retries, side.dead)
    return replies


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


def _outcome(exp, state, t0, finished) -> str | None:
    return outcome(exp.bundle, exp.setup, state, finished, time.perf_counter() - t0,
                   exp.config.max_seconds)


def _iterate_on_arrival(exp: Experiment, num_updates: int, resume=None, on_record=None):
    bundle, setup, config = exp.bundle, exp.setup, exp.config
    durations = client_durations(config, exp.num_clients)
    state, side, update = _start(exp, resume)
    tally, t0 = Tally(), time.perf_counter()
    idle = set(range(exp.num_clients)) - side.dead  # a resumed run: every live client idle
    queue: list = []
    now = float((resume.counters.get("virtual_time") or 0.0) if resume else 0.0)
    if update >= num_updates:
        return
    while True:
        check_stop()
        number = update + 1
        rnd = Round(number, 0, round_seed(config.seed, bundle.name, number, 0), frozenset(idle),
                    eval_point(number, config.eval_every, num_updates))
        for pid, req in sorted(bundle.requests(state, setup, rnd).items()):
            reply = side.reply(state, pid, req, number, 0, tally, judged=False)
            heapq.heappush(queue, (now + durations[pid], pid, req.action, reply))
            idle.discard(pid)
        if not queue:
            if side.dead:
                err = RunStopped(f"update {number}: no partition left to ask (partitions "
                                 f"{sorted(side.dead)} timed out)")
                err.state = state
                raise err
            raise RuntimeError(f"bundle {bundle.name!r} sent no request with every client idle")
        now, pid, action, reply = heapq.heappop(queue)
        if pid not in side.dead:  # a timed-out partition never becomes idle again
            idle.add(pid)
        if not isinstance(reply, Rejection):  # judged against the state it lands on, as in Flower
            reply = judge(bundle, setup, exp.actions, state, pid, action, reply)
        state, info = bundle.server_step(state, [(pid, reply)], setup, rnd)
        update += info.updates
        tally.add(info)
        if info.updates == 0:
            continue
        finished = update >= num_updates
        if eval_point(update, config.eval_every, num_updates) or finished:
            outcome = _outcome(exp, state, t0, finished)
            yield update, state, tally.log(float(now))._replace(outcome=outcome)
            _checkpoint(on_record, update, state, side, float(now))
            if outcome is not None:
                return


def run_in_process(config, output_dir: str | None = None, progress: bool = True,
                   resume=None) -> dict:
    """Run any registered algorithm without Flower; same seeds, same maths, same result files.

    A checkpoint is written after every history row; ``resume`` (a
    :class:`fedbayes_flwr.runtime.checkpoint.Checkpoint`), or else the run-config key ``resume`` (a
    stored run's directory, :func:`fedbayes_flwr.runtime.checkpoint.resumed`), continues the run it
    stores, up to ``config.num_rounds`` updates in all. Returns the ``result.json`` content.
    """

    if resume is None:
        config, resume = resumed(config)
    exp = build_experiment(config)
    posterior = None
    if resume is not None:
        check_fits(resume, exp.bundle.name, exp.bundle.init_server(exp.setup))
        posterior = exp.bundle.posterior(resume.server_state, exp.setup)
    recorder = Recorder(exp, "in-process", output_dir, progress, resume, posterior)

    def on_record(update, state, clients, virtual_time, dead):
        recorder.checkpoint(update, state, clients, virtual_time=virtual_time, dead=dead)

    try:
        for update, state, log in iterate_in_process(exp, resume=resume, on_record=on_record):
            recorder.record(update, exp.bundle.posterior(state, exp.setup), log)
        recorder.finish()
    except RunStopped as err:
        recorder.stop(err.reason,
                      None if err.state is None else exp.bundle.posterior(err.state, exp.setup))
    except Interrupted:
        recorder.interrupt()
    with open(os.path.join(recorder.output_dir, "result.json")) as f:
        return json.load(f)
