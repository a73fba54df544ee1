"""The generic in-process engine: runs any algorithm bundle without Flower, on the same seeds.

Two modes, chosen by the bundle (:attr:`fedbayes_flwr.algorithms.base.Bundle.mode`):

* ``barrier``: each exchange sends the bundle's requests, collects every reply (in partition
  order), then makes one server step;
* ``apply-on-arrival``: every idle client gets a request; replies land on a virtual clock
  (client ``k`` takes :func:`fedbayes_flwr.runtime.faults.client_durations` ``[k]``; ties by partition
  id) and each is applied alone, after which ``requests`` is asked again with that client idle.

The pieces the Flower glue shares (so the glue adds no maths) are in
:mod:`fedbayes_flwr.runtime.steps`: ``client_work`` (one client's step, with fault injection),
``judge`` (structural validation + the bundle's invariant), ``Tally`` (what a history row reports)
and ``eval_point``.

Results are recorded at *evaluation points*: after every ``eval-every``-th update once the
bundle says the update is settled, and always after the last one; ``done(state)`` and
``max-seconds`` are checked there.
"""

from __future__ import annotations

import heapq
import json
import os
import time

from fedbayes_flwr.algorithms.base import Rejection, Round, failure_policy, round_seed
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.inference.posterior import Posterior
from fedbayes_flwr.inference.tree import payload_nbytes
from fedbayes_flwr.runtime.checkpoint import check_client_count, check_fits, resumed
from fedbayes_flwr.runtime.experiment import Experiment, build_experiment
from fedbayes_flwr.runtime.faults import InjectedFault, client_durations
from fedbayes_flwr.runtime.recorder import Recorder
from fedbayes_flwr.runtime.steps import (
    Interrupted,
    Tally,
    check_stop,
    client_work,
    eval_point,
    judge,
    not_sent,
    outcome,
    stop_on_failure,
    timed_out,
)


class _InProcess:
    """Client states and the client side of the in-process engine; ``dead``: partitions that
    timed out (``hang``), which get no further requests."""

    def __init__(self, exp: Experiment):
        self.exp = exp
        self.clients = {pid: exp.bundle.init_client(exp.setup, pid) for pid in range(exp.num_clients)}
        self.dead: set[int] = set()
        self.last_train = dict.fromkeys(self.clients, 0)  # each partition's last train update

    def reply(self, server_state, pid: int, request, number: int, attempt: int, tally: Tally,
              judged: bool = True):
        """The client's reply (or Rejection); ``judged`` validates it against ``server_state``
        now (barrier), else the caller judges it against the state it lands on (arrival)."""
        if pid in self.dead:
            return not_sent(pid)
        tally.down += payload_nbytes(request.message)
        previous = self.last_train[pid]
        if attempt == 0 and self.exp.actions[request.action].category == "train":
            self.last_train[pid] = number
        try:
            self.clients[pid], reply = client_work(self.exp, self.clients[pid], pid, request,
                                                   number, attempt, previous)
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
    side.last_train = dict.fromkeys(side.clients, resume.update)  # earlier faults fired before
    side.dead = {int(p) for p in resume.counters.get("dead", ())}  # still out, as over Flower
    return resume.server_state, side, resume.update


def _checkpoint(on_record, update, state, side, virtual_time=None) -> None:
    if on_record is not None:
        on_record(update, state, tuple(side.clients[p] for p in sorted(side.clients)),
                  virtual_time, tuple(sorted(side.dead)))


def _stopped_at(err: RunStopped, update, state, side, tally, on_record, virtual_time=None):
    """Attach to ``err`` what the run computed before it stopped: the state after ``update``
    updates, the log since the last row and the hook that checkpoints that state."""
    err.state, err.update, err.log = state, update, tally.log(virtual_time)
    err.save = lambda: _checkpoint(on_record, update, state, side, virtual_time)


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
        try:  # requests may stop the run too (a privacy budget that the next round would pass)
            requests = bundle.requests(state, setup, rnd)
        except RunStopped as err:
            _stopped_at(err, update, state, side, tally, on_record)
            raise
        replies = {pid: side.reply(state, pid, req, number, 0, tally)
                   for pid, req in sorted(requests.items())}
        try:
            replies = _apply_policy(exp, state, side, requests, replies, number, tally)
            state, info = bundle.server_step(state, sorted(replies.items()), setup, rnd)
        except RunStopped as err:  # the caller records and saves what was computed before
            _stopped_at(err, update, state, side, tally, on_record)
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
                _stopped_at(err, update, state, side, tally, on_record, float(now))
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
    return run_in_process_with_posterior(config, output_dir, progress, resume)[0]


def run_in_process_with_posterior(config, output_dir: str | None = None, progress: bool = True,
                                  resume=None) -> tuple[dict, Posterior | None]:
    """:func:`run_in_process`, returning also the posterior it wrote as ``posterior.npz``.

    Returns
    -------
    result : dict
        The ``result.json`` content.
    posterior : Posterior or None
        The posterior object of the last row (or of the state a stopped run ended in); ``None``
        when the run recorded none.
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
        posterior = None if err.state is None else exp.bundle.posterior(err.state, exp.setup)
        last = recorder.history[-1]["round"] if recorder.history else 0
        if posterior is not None and err.log is not None and err.update > last:
            # the updates made since the last row (a sampler's draws so far) become a row, with
            # its plots and checkpoint, so a stopped run loses nothing it computed
            recorder.record(err.update, posterior, err.log)
            if err.save is not None:
                err.save()
        recorder.stop(err.reason, posterior)
    except Interrupted:
        recorder.interrupt()
    with open(os.path.join(recorder.output_dir, "result.json")) as f:
        return json.load(f), recorder.posterior
