"""Failing clients: ``raise-always``, ``hang`` and ``garbage`` (inject-fault) and the per-round
timeout (``round-timeout``), in the in-process engine, in the Flower strategy over an in-process
Grid (fast), and through Flower's Simulation Engine (marked).

Round-based (barrier) algorithms go on without the failed client and record it; a client that
times out is dead for the rest of the run (no further messages; PVI's free energy is then None).
Event-based samplers (failure policy ``retry-stop``) retry with fresh attempt seeds, then stop
with their results saved and a one-line reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import ConfigError, parse_faults, parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.steps import judge, not_sent, timed_out

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# conjugate PVI: with damping 1 one synchronous round gives every client its exact factor
LR = {"model": "linear-regression", "dataset": "synthetic", "num-clients": 10, "partition": "iid",
      "covariance": "full", "damping": 1.0, "num-rounds": 3, "seed": 3}
GM = {"algorithm": "pdmc", "model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 3,
      "synthetic-size": 60, "num-clients": 4, "partition": "iid", "prior-scale": 1.0,
      "pdmc.process-time": 5.0, "eval-every": 5}
RING = {"algorithm": "dhmc", "model": "linear-regression", "dataset": "synthetic",
        "synthetic-dim": 3, "synthetic-size": 250, "num-clients": 5, "partition": "iid",
        "dhmc.graph": "ring", "prior-scale": 1.0, "dhmc.mixing-rounds": 5,
        "dhmc.energy": "taylor", "dhmc.warmup": 5, "dhmc.iterations": 30}


def _exact_without(exp, dropped: int):
    """The exact conjugate posterior of every partition's rows but ``dropped``'s (same split)."""
    keep = [p for p in range(exp.num_clients) if p != dropped]
    x = np.concatenate([exp.client_data(p).x for p in keep])
    y = np.concatenate([exp.client_data(p).y for p in keep])
    return G.to_moments(models.exact_posterior(exp.model, exp.prior, x, y))


def _assert_exact_without(mean, cov, exp, dropped: int, atol: float) -> None:
    want_mean, want_cov = _exact_without(exp, dropped)
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=atol)
    np.testing.assert_allclose(cov, want_cov, rtol=0, atol=atol)
    # power: the posterior of ALL the rows is far from it, so leaving the client in would fail
    all_mean = G.to_moments(models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train,
                                                   exp.dataset.y_train))[0]
    assert np.max(np.abs(all_mean - want_mean)) > 100 * atol


# ------------------------------------------------------------------ configuration
def test_fault_specs_and_round_timeout_are_validated():
    assert parse_faults("raise-always@1:3, hang@2:7") == (("raise-always", 1, 3), ("hang", 2, 7))
    assert parse_run_config({"inject-fault": "garbage@2:1"}).round_timeout == 600.0
    with pytest.raises(ConfigError, match="inject-fault kind 'sleep'"):
        parse_run_config({"inject-fault": "nan@1:1,sleep@2:1"})
    with pytest.raises(ConfigError, match="inject-fault: hang@1:10: needs ROUND >= 1 and a "
                                          "PARTITION in 0..9"):
        parse_run_config({"inject-fault": "hang@1:10"})
    with pytest.raises(ConfigError, match="round-timeout: must be > 0 seconds, got 0.0"):
        parse_run_config({"round-timeout": 0})
    with pytest.raises(ConfigError, match="'round-timeout': expected a finite number"):
        parse_run_config({"round-timeout": "inf"})


# ------------------------------------------------------------------ in-process engine
def test_raise_always_client_is_left_out_and_pvi_is_exact_without_it():
    exp = build_experiment(parse_run_config({**LR, "inject-fault": "raise-always@1:3"}))
    rows = list(iterate_in_process(exp))
    for _, _, log in rows:
        assert log.clients == (0, 1, 2, 4, 5, 6, 7, 8, 9)
        assert log.rejected and all(r == (3, "reply", "client failed (raise-always)")
                                    for r in log.rejected)
    mean, cov = G.to_moments(rows[-1][1].posterior)
    # 9 exact factors added in float64: rounding ~1e-15 relative; 1e-9 leaves room, no more
    _assert_exact_without(mean, cov, exp, 3, atol=1e-9)


def test_hung_client_times_out_without_waiting_and_is_never_asked_again():
    exp = build_experiment(parse_run_config({**LR, "num-clients": 4, "round-timeout": 600.0,
                                             "inject-fault": "hang@2:1"}))
    t0 = time.perf_counter()
    logs = [log for _, _, log in iterate_in_process(exp)]
    assert time.perf_counter() - t0 < 60  # the in-process engine never sleeps the 600 s
    assert not logs[0].rejected and logs[0].log_marginal_likelihood is not None
    assert logs[1].rejected[0] == timed_out(1, 600.0)
    assert logs[1].rejected[0].reason == "no reply within round-timeout (600 s)"
    assert set(logs[1].rejected[1:]) == {not_sent(1)}  # later exchanges: never sent
    assert logs[2].rejected and set(logs[2].rejected) == {not_sent(1)}
    for log in logs[1:]:
        assert 1 not in log.clients and log.log_marginal_likelihood is None  # not everyone
    # bytes: the dead partition's requests are not counted (every request has the same size)
    assert logs[2].bytes_down * 4 == logs[0].bytes_down * 3


def test_garbage_reply_is_rejected_like_a_dropped_one_and_the_codec_agrees():
    from fedbayes_flwr import codec
    from fedbayes_flwr.runtime.steps import client_work

    keys = {**LR, "num-clients": 4, "damping": 0.5}
    exp = build_experiment(parse_run_config({**keys, "inject-fault": "garbage@2:1"}))
    rows = list(iterate_in_process(exp))
    dropped = list(iterate_in_process(build_experiment(parse_run_config(
        {**keys, "inject-fault": "drop@2:1"}))))
    (bad,) = rows[1][2].rejected
    assert bad.partition_id == 1 and bad.reason.startswith("dtype uint8, expected float64")
    assert [log.rejected for _, _, log in rows][::2] == [(), ()]  # one-shot: rounds 1, 3 clean
    for a, b in zip(rows[-1][1].posterior, dropped[-1][1].posterior, strict=True):
        np.testing.assert_array_equal(a, b)
    # the same reply through Flower's records: the codec names the same field and reason
    server = exp.bundle.init_server(exp.setup)
    rnd_requests = exp.bundle.requests(server, exp.setup, _round(exp, 2))
    request = rnd_requests[1]
    _, reply = client_work(exp, exp.bundle.init_client(exp.setup, 1), 1, request, 2)
    spec = exp.actions[request.action]
    kind = f"{exp.bundle.name}.{request.action}.reply"
    with pytest.raises(codec.CodecError) as err:
        codec.decode(codec.encode(reply, kind), kind, spec.reply, spec.allow_inf)
    judged = judge(exp.bundle, exp.setup, exp.actions, server, 1, request.action, reply)
    assert (err.value.field, err.value.reason) == (judged.field, judged.reason)


def _round(exp, number):
    from fedbayes_flwr.algorithms.base import Round, round_seed

    return Round(number, 0, round_seed(exp.config.seed, exp.bundle.name, number, 0),
                 frozenset(range(exp.num_clients)), True)


@pytest.mark.parametrize("keys", [GM, RING], ids=["pdmc", "dhmc"])
@pytest.mark.parametrize("kind", ["raise-always", "hang"])
def test_event_based_sampler_retries_then_stops_with_results_saved(tmp_path, keys, kind):
    result = run_in_process(parse_run_config({**keys, "inject-fault": f"{kind}@3:2",
                                              "output-dir": str(tmp_path)}), progress=False)
    reason = result["reason"]
    assert result["outcome"] == "stopped" and "\n" not in reason, result
    assert reason.startswith("update 3: partition 2 failed (reply: ")
    if kind == "raise-always":  # retried with fresh attempt seeds (max-retries = 2), in vain
        assert "client failed (raise-always)) after 2 retries;" in reason
    else:  # a timed-out partition is dead: no retry
        assert "no reply within round-timeout (600 s));" in reason and "retries" not in reason
    assert reason.endswith(f"the {keys['algorithm']} bundle stops on failures")
    assert (tmp_path / "posterior.npz").is_file()  # what was sampled before the stop


# ------------------------------------------------------------------ the Flower strategy
def _strategy_run(monkeypatch, keys, num_rounds):
    """Run the generic strategy over a :class:`flower_utils.LoopbackGrid`: ``(strategy, grid,
    rows, ttls)`` with ``rows`` the ``(update, seconds since start, RoundLog)`` of each
    evaluation point and ``ttls`` the time-to-live each hung ClientApp was told to outlast."""
    import clients.handler as handler
    from strategies.server_app import strategy_for
    from tests.helpers.flower_utils import LoopbackGrid, task_identity

    ttls: list = []
    monkeypatch.setattr(handler, "hang_seconds", lambda ttl: ttls.append(ttl) or 0.0)
    exp = build_experiment(parse_run_config(keys))
    strategy = strategy_for(exp)
    grid, rows, t0 = LoopbackGrid(exp), [], time.monotonic()
    with task_identity():
        try:
            strategy.start(grid, num_rounds=num_rounds, evaluate_fn=lambda u, _: rows.append(
                (u, time.monotonic() - t0, strategy.round_logs[u])))
        except RunStopped as err:
            return strategy, grid, rows, ttls, err
    return strategy, grid, rows, ttls, None


def test_strategy_times_out_a_hung_node_once_and_sends_it_nothing_more(monkeypatch):
    timeout = 0.4
    keys = {**LR, "num-clients": 4, "round-timeout": timeout, "inject-fault": "hang@2:1"}
    strategy, grid, rows, ttls, stopped = _strategy_run(monkeypatch, keys, 3)
    assert stopped is None and strategy.outcome == "completed"
    assert {m.metadata.ttl for _, m in grid.pushed} == {timeout}  # every message: ttl = timeout
    assert ttls == [timeout]  # the hung ClientApp outlasts exactly its message's ttl
    hung = [i for i, (pid, m) in enumerate(grid.pushed) if pid == 1]
    assert all(grid.pushed[i][0] != 1 for i in range(hung[-1] + 1, len(grid.pushed)))
    assert strategy.dead == {1}
    (u1, t1, log1), (u2, t2, log2), (u3, _, log3) = rows
    # the exchange with the hung node lasts the timeout: no less (it waited), and no more than
    # one 50 ms pull interval and the rest of update 2's work (in-process, milliseconds) later
    assert timeout <= t2 - t1 < timeout + 1.0
    assert log2.rejected[0] == timed_out(1, timeout) and set(log2.rejected[1:]) <= {not_sent(1)}
    assert set(log3.rejected) == {not_sent(1)}
    assert log2.log_marginal_likelihood is None and log3.log_marginal_likelihood is None
    # the glue adds no maths: the in-process engine gives the same posterior and rows
    local = list(iterate_in_process(build_experiment(parse_run_config(keys))))
    for a, b in zip(strategy.state.posterior, local[-1][1].posterior, strict=True):
        np.testing.assert_array_equal(a, b)
    for (_, _, flower), (_, _, mine) in zip(rows, local, strict=True):
        assert flower._replace(virtual_time=None) == mine


def test_strategy_on_arrival_times_out_a_hung_node_and_goes_on(monkeypatch):
    """Asynchronous PVI (apply-on-arrival): the hung request becomes a timeout rejection once
    its own deadline passes while the other clients keep updating; the node is never idle
    again."""
    keys = {**LR, "num-clients": 3, "schedule": "asynchronous", "round-timeout": 0.3,
            "client-delay": 0.05, "inject-fault": "hang@2:1"}
    # 2 live clients at 0.05 s per update: 16 updates take ~0.8 s, past the 0.3 s deadline
    strategy, grid, rows, _, stopped = _strategy_run(monkeypatch, keys, 16)
    assert stopped is None and strategy.outcome == "completed" and len(rows) == 16
    rejected = [r for _, _, log in rows for r in log.rejected]
    assert rejected == [timed_out(1, 0.3)]
    to_one = [m for pid, m in grid.pushed if pid == 1]
    assert len(to_one) == 2  # its update-1 request, then the one it hung on; nothing after
    assert strategy.dead == {1}


@pytest.mark.parametrize("kind", ["raise-always", "hang"])
def test_strategy_event_based_sampler_retries_then_stops(monkeypatch, kind):
    keys = {**GM, "round-timeout": 0.3, "inject-fault": f"{kind}@3:2"}
    strategy, grid, _, _, stopped = _strategy_run(monkeypatch, keys, 40)
    assert stopped is not None and "partition 2 failed" in stopped.reason
    from fedbayes_flwr import codec

    attempts = [int(codec.config_of(m.content)["attempt"]) for pid, m in grid.pushed if pid == 2
                and int(codec.config_of(m.content)["round"]) == 3]
    if kind == "raise-always":  # fresh attempt seeds: attempt 0, then 1 and 2 (max-retries)
        assert attempts == [0, 1, 2] and stopped.reason.count("after 2 retries") == 1
    else:  # dead after the timeout: never re-sent
        assert attempts == [0] and "no reply within round-timeout (0.3 s)" in stopped.reason


# ------------------------------------------------------------------ Flower's Simulation Engine
SIM_TIMEOUT = 10.0  # round-timeout of the simulated run: the hang costs this much wall time
SIM_KEYS = {**LR, "round-timeout": SIM_TIMEOUT, "inject-fault": "raise-always@1:3,hang@2:7"}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """ONE Simulation Engine run (Ray start is most of its cost) for both Flower checks: 10
    clients, partition 3 raises on every call from update 1, partition 7 hangs in update 2."""
    out = tmp_path_factory.mktemp("faults") / "flower"
    rc = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}"
                  for k, v in SIM_KEYS.items())
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "run_simulation.py"), "--engine", "simulation",
         "--quiet", "--output-dir", str(out), "--num-cpus-per-client", "1", "--run-config", rc],
        capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONPATH": ROOT},
        cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "result.json").read_text()), np.load(out / "posterior.npz")


@pytest.mark.flower
@pytest.mark.slow
def test_simulation_client_raising_on_every_call_is_left_out_exactly(simulated):
    result, post = simulated
    assert result["outcome"] == "completed" and result["engine"] == "simulation"
    for row in result["history"]:
        assert 3 not in row["clients"] and 3 in {r["partition_id"] for r in row["rejections"]}
    exp = build_experiment(parse_run_config(SIM_KEYS))
    # exact factors of 9 partitions through float64 records: 1e-6 is the bar (the
    # arithmetic gives ~1e-15)
    _assert_exact_without(post["mean"], post["cov"], exp, 3, atol=1e-6)


@pytest.mark.flower
@pytest.mark.slow
def test_simulation_hung_client_times_out_within_the_round_timeout_and_the_run_ends(simulated,
                                                                                  tmp_path):
    result, _ = simulated
    h1, h2, h3 = result["history"]
    sevens = [[r["reason"] for r in row["rejections"] if r["partition_id"] == 7]
              for row in result["history"]]
    assert sevens[0] == []
    assert sevens[1][0] == f"no reply within round-timeout ({SIM_TIMEOUT:g} s)"
    assert set(sevens[1][1:]) <= {not_sent(7).reason} and set(sevens[2]) == {not_sent(7).reason}
    assert all(7 not in row["clients"] for row in (h2, h3))
    assert h2["log_marginal_likelihood"] is None and h3["log_marginal_likelihood"] is None
    # update 2 waited the timeout for the hung node, then went on: at least the timeout, and
    # within 5 s more (one 50 ms pull interval, the free-energy exchange (~0.2 s) and the test
    # metrics, with room for a loaded 2-core machine)
    assert SIM_TIMEOUT <= h2["elapsed_s"] - h1["elapsed_s"] < SIM_TIMEOUT + 5.0
    # the run ended: the process exited 0 (the fixture's check) although the hung ClientApp
    # holds its Ray actor until it wakes, 2 s past its ttl, and raises
    assert result["outcome"] == "completed"
    # the glue adds no maths: the in-process engine gives the same rows (client errors read
    # differently: Flower reports the ClientApp's exception text)
    local = run_in_process(parse_run_config({**SIM_KEYS, "output-dir": str(tmp_path)}),
                           progress=False)
    keep = ("round", "clients", "rejected_replies", "log_marginal_likelihood", "bytes_down",
            "bytes_up", "test_rmse", "test_nll")
    assert ([{k: row.get(k) for k in keep} for row in result["history"]]
            == [{k: row.get(k) for k in keep} for row in local["history"]])


@pytest.mark.parametrize("keys", [GM, RING], ids=["pdmc", "dhmc"])
def test_a_stopped_sampler_records_its_draws_as_a_row_with_plots_and_checkpoint(tmp_path, keys,
                                                                                capsys):
    """The stop comes between two evaluation points (``eval-every`` 100, the failure at update
    3): the two updates made are recorded as a row, the plots and the checkpoint are written,
    and the one line printed says where the run stopped (issue 32, row 10)."""
    from fedbayes_flwr.runtime import checkpoint as C

    result = run_in_process(parse_run_config({**keys, "inject-fault": "raise-always@3:2",
                                              "max-retries": 0, "eval-every": 100,
                                              "output-dir": str(tmp_path)}), progress=False)
    assert result["outcome"] == "stopped"
    assert [row["round"] for row in result["history"]] == [2]
    assert (tmp_path / "metrics.png").is_file() and C.load(str(tmp_path)).update == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "stopped" in x]
    assert len(lines) == 1 and lines[0].startswith("run stopped after update 2 of "), lines
    assert "update 3: partition 2 failed" in lines[0]


@pytest.mark.parametrize("schedule", ["sequential", "asynchronous"])
def test_strategy_fires_a_one_shot_fault_as_in_process(monkeypatch, schedule):
    """Over Flower the strategy tells each node the update of its previous train request, so a
    one-shot fault fires on the same request as in-process (issue 32, row 11)."""
    keys = {**LR, "num-clients": 3, "pvi.schedule": schedule, "inject-fault": "garbage@2:0",
            "stragglers": "0" if schedule == "asynchronous" else "", "straggler-factor": 2.0}
    strategy, _, rows, _, stopped = _strategy_run(monkeypatch, keys, 8)
    assert stopped is None
    flower = [(u, r.partition_id) for u, _, log in rows for r in log.rejected]
    local = [(u, r.partition_id) for u, _, log in
             iterate_in_process(build_experiment(parse_run_config({**keys, "num-rounds": 8})))
             for r in log.rejected]
    assert len(flower) == 1 and flower[0][1] == 0 and len(local) == 1, (flower, local)
    if schedule == "sequential":  # deterministic: the same request; asynchronous runs order
        assert flower == local    # arrivals by wall clock over Flower, by virtual time here
