"""Checkpoint and resume: "6 updates" equals "3 updates, stop, resume to 6" bit for bit, for
every registered family with a deterministic schedule; a killed run resumes from its last
checkpoint; the checkpoint file round-trips any state exactly, without pickle."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np
import pytest

from fedbayes_flwr.algorithms.commit import Pending
from fedbayes_flwr.deploy import watchdog as processes
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime import checkpoint as C
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = {"model": "linear-regression", "dataset": "synthetic", "num-clients": 3,
        "partition": "iid", "seed": 1}
# every family whose schedule is deterministic (AMPS is one-shot: its own test below);
# eval-every=3 records at 3 and 6 in both runs (PDMC's preset raises an eval-every of 1)
CASES = {  # small settings: each case runs 6 + 3 + 3 updates in about a second
    "pvi-synchronous": {"algorithm": "pvi"},  # damping 'auto': server-held factors
    "pvi-synchronous-client-factors": {"algorithm": "pvi", "pvi.damping": 0.5,
                                       "pvi.guard": False},
    "pvi-sequential": {"algorithm": "pvi", "pvi.schedule": "sequential"},
    "dsvgd": {"algorithm": "dsvgd", "dsvgd.num-particles": 10, "dsvgd.local-iterations": 10,
              "dsvgd.distillation-iterations": 10},
    "u-dsvgd": {"algorithm": "u-dsvgd", "dsvgd.num-particles": 10,  # KDE history grows
                "dsvgd.local-iterations": 10},
    "sgld": {"algorithm": "sgld", "sgld.num-chains": 8, "sgld.steps-per-round": 10},
    "fedavg": {"algorithm": "fedavg", "fedavg.local-steps": 10},
    "pdmc": {"algorithm": "pdmc", "eval-every": 3},
    "pdmc-metropolis": {"algorithm": "pdmc", "eval-every": 3, "pdmc.bounds": "metropolis",
                        "pdmc.trajectory": 0.25, "pdmc.rate-grid": 0.25},
    "dhmc": {"algorithm": "dhmc", "eval-every": 3, "dhmc.num-chains": 4,
             "dhmc.mixing-rounds": 3},
}
TIMING_KEYS = {"elapsed_s", "wall_s", "merge_seconds", "fit_seconds_max", "fit_seconds_mean"}


def _untimed(value):
    """A history value without wall-clock timings; NaN made comparable (NaN != NaN)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _run(keys: dict, out, rounds: int, resume=None) -> dict:
    if resume is not None:
        ckpt = C.load(str(resume))
        return run_in_process(C.resume_config(ckpt, str(resume), rounds), progress=False,
                              resume=ckpt)
    return run_in_process(parse_run_config({**BASE, **keys, "num-rounds": rounds,
                                            "output-dir": str(out)}), progress=False)


def _assert_same_run(full: dict, resumed: dict, full_dir, resumed_dir) -> None:
    # exact: every posterior array bit for bit, every history value except wall-clock timings
    assert resumed["outcome"] == full["outcome"] == "completed"
    assert _untimed(resumed["history"]) == _untimed(full["history"])
    with np.load(full_dir / "posterior.npz") as a, np.load(resumed_dir / "posterior.npz") as b:
        assert a.files == b.files
        for key in a.files:
            assert np.array_equal(a[key], b[key]), key


@pytest.mark.parametrize("case", sorted(CASES))
def test_six_updates_equal_three_then_resume_to_six(case, tmp_path):
    keys = CASES[case]
    full = _run(keys, tmp_path / "full", 6)
    _run(keys, tmp_path / "half", 3)
    assert C.load(str(tmp_path / "half")).update == 3
    resumed = _run(keys, None, 6, resume=tmp_path / "half")
    assert [r["round"] for r in resumed["history"]][-1] == 6
    _assert_same_run(full, resumed, tmp_path / "full", tmp_path / "half")
    assert C.load(str(tmp_path / "half")).update == 6  # the resumed run checkpoints too


def test_amps_one_shot_checkpoint_resumes_as_completed(tmp_path):
    """AMPS is one-shot (its preset fixes num-rounds=1): its checkpoint restores the merged
    posterior exactly and resuming the finished run changes nothing."""
    keys = {"algorithm": "amps"}
    full = _run(keys, tmp_path / "amps", 1)
    before = dict(np.load(tmp_path / "amps" / "posterior.npz"))
    resumed = _run(keys, None, 1, resume=tmp_path / "amps")
    assert _untimed(resumed["history"]) == _untimed(full["history"])
    with np.load(tmp_path / "amps" / "posterior.npz") as after:
        for key, value in before.items():
            assert np.array_equal(after[key], value), key


def _factor(state: Pending, accepted_round: int):
    """The factor t_k the server applied: the pending one if its reply was accepted."""
    return state.pending if state.pending_round == accepted_round else state.value


@pytest.mark.parametrize("schedule", ["synchronous", "sequential", "asynchronous"])
def test_resumed_pvi_clients_agree_with_the_server(schedule, tmp_path):
    """q = p x prod_k t_k (Ashman et al. 2022, eq. 1) holds after a resume for the factors the
    checkpoint stores (server-held for synchronous PVI, client-held otherwise): no factor is
    lost or counted twice. Asynchronous PVI resumes with every client idle (the replies in
    flight are dropped), so it is not bit-for-bit equal to an uninterrupted run, but it must
    stay consistent."""
    keys = {"algorithm": "pvi", "pvi.schedule": schedule, "pvi.damping": 0.5, "num-clients": 4}
    _run(keys, tmp_path / "run", 5)
    resumed = _run(keys, None, 10, resume=tmp_path / "run")
    assert [r["round"] for r in resumed["history"]] == list(range(1, 11))
    ckpt = C.load(str(tmp_path / "run"))
    state = ckpt.server_state
    product = state.prior
    for pid, client in enumerate(ckpt.client_states):
        if state.factors is not None:  # server-held factors
            factor = G.NaturalGaussian(state.factors.eta1[pid], state.factors.eta2[pid])
        else:
            factor = _factor(client, int(state.accepted_round[pid]))
        product = G.add(product, factor)
    # sums of a few float64 natural parameters of order 1e2: round-off ~1e-13 relative
    np.testing.assert_allclose(product.eta1, state.posterior.eta1, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(product.eta2, state.posterior.eta2, rtol=1e-10, atol=1e-10)


class _Inner(NamedTuple):
    a: np.ndarray
    b: float


class _Outer(NamedTuple):
    inner: _Inner
    items: tuple
    n: np.int64
    flag: bool
    none: object
    label: str


def test_checkpoint_round_trips_states_exactly_without_pickle(tmp_path):
    state = _Outer(_Inner(np.array([[1.0, np.inf], [np.nextafter(0, 1), -0.0]]), 0.1 + 0.2),
                   (np.arange(3, dtype=np.int32), 1e-300, (np.float32(2.5),)), np.int64(7),
                   True, None, "x")
    ckpt = C.Checkpoint("toy", "in-process", {"seed": 1}, 4, state, (state, state), (2, 3),
                        [{"round": 4, "x": float("nan")}], {"accepted": 3})
    C.save(str(tmp_path), ckpt)
    back = C.load(str(tmp_path))
    assert type(back.server_state) is _Outer and type(back.server_state.inner) is _Inner
    assert back.server_state.inner.a.tobytes() == state.inner.a.tobytes()  # bits, incl. -0.0
    assert back.server_state.inner.b == 0.1 + 0.2 and back.server_state.items[1] == 1e-300
    assert back.server_state.items[0].dtype == np.int32
    assert back.server_state.items[2][0].dtype == np.float32  # numpy scalars keep their dtype
    assert back.server_state.n == 7 and type(back.server_state.n) is np.int64
    assert back.server_state[3:] == (True, None, "x")
    assert back.client_versions == (2, 3) and len(back.client_states) == 2
    assert back.update == 4 and back.counters == {"accepted": 3}
    with np.load(tmp_path / C.FILE, allow_pickle=False) as data:  # readable without pickle
        assert all(data[k].dtype != object for k in data.files)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # renamed into place


def test_in_process_resume_keeps_a_timed_out_partition_out(tmp_path):
    """A partition that timed out before the checkpoint stays out of the resumed run (never
    asked again, as over Flower) instead of timing out a second time; the result equals the
    uninterrupted run bit for bit."""
    from fedbayes_flwr.runtime.engine import iterate_in_process
    from fedbayes_flwr.runtime.steps import not_sent

    keys = {"algorithm": "pvi", "pvi.damping": 1.0, "inject-fault": "hang@2:1"}
    full = _run(keys, tmp_path / "full", 5)
    _run(keys, tmp_path / "half", 3)
    ckpt = C.load(str(tmp_path / "half"))
    assert ckpt.counters["dead"] == [1]
    exp = build_experiment(C.resume_config(ckpt, str(tmp_path / "half"), 5))
    logs = [log for _, _, log in iterate_in_process(exp, resume=ckpt)]
    assert len(logs) == 2 and all(set(log.rejected) == {not_sent(1)} for log in logs)
    resumed = _run(keys, None, 5, resume=tmp_path / "half")
    _assert_same_run(full, resumed, tmp_path / "full", tmp_path / "half")


def test_resume_refuses_a_missing_or_foreign_checkpoint(tmp_path):
    with pytest.raises(C.CheckpointError, match="no checkpoint.npz"):
        C.load(str(tmp_path))
    _run({"algorithm": "sgld"}, tmp_path / "sgld", 1)
    ckpt = C.load(str(tmp_path / "sgld"))
    with pytest.raises(C.CheckpointError, match="bundle 'sgld'"):
        run_in_process(parse_run_config({**BASE, "algorithm": "pvi",
                                         "output-dir": str(tmp_path / "x")}),
                       progress=False, resume=ckpt)


# ---------------------------------------------------------------------------- the resume key
def test_resume_key_continues_the_stored_run_in_its_directory(tmp_path):
    """``resume=DIR`` in the run config (what ``flwr run`` and Python users have) is the same
    resume as ``--resume``: the same keys with a larger ``num-rounds`` give the uninterrupted
    run bit for bit, in DIR, whatever ``output-dir`` says (a warning names the unused one)."""
    keys = CASES["u-dsvgd"]  # client states that grow
    plain = parse_run_config({**BASE, **keys, "output-dir": str(tmp_path / "x")})
    assert C.resumed(plain) == (plain, None)  # no resume key: nothing to load
    full = _run(keys, tmp_path / "full", 6)
    _run(keys, tmp_path / "half", 3)
    config = parse_run_config({**BASE, **keys, "num-rounds": 6, "resume": str(tmp_path / "half"),
                               "output-dir": str(tmp_path / "elsewhere")})
    with pytest.warns(UserWarning, match="output-dir .*elsewhere.* is not used: the resumed "
                                         "run goes on in .*half"):
        resumed = run_in_process(config, progress=False)
    assert not (tmp_path / "elsewhere").exists()
    _assert_same_run(full, resumed, tmp_path / "full", tmp_path / "half")
    assert resumed["run_config"]["resume"] == str(tmp_path / "half")
    assert C.load(str(tmp_path / "half")).update == 6


def test_resume_key_refuses_another_experiment_naming_each_key(tmp_path):
    _run({"algorithm": "pvi"}, tmp_path / "pvi", 1)
    other = {**BASE, "algorithm": "pvi", "seed": 2, "num-clients": 4, "num-rounds": 3,
             "output-dir": str(tmp_path / "pvi"), "resume": str(tmp_path / "pvi")}
    with pytest.raises(C.CheckpointError, match=r"only num-rounds may change\); differs in "
                       r"num-clients: stored 3, given 4; seed: stored 1, given 2$"):
        C.resumed(parse_run_config(other))
    os.chdir(tmp_path)  # a relative DIR: the error says where it looked
    with pytest.raises(C.CheckpointError, match=f"no checkpoint.npz in 'nowhere' "
                       f"\\(= {tmp_path}/nowhere\\)"):
        C.resumed(parse_run_config({**BASE, "resume": "nowhere"}))


def test_server_app_resume_key_puts_the_nodes_states_back(tmp_path):
    """The ServerApp reads ``resume`` from its run config (``flwr run``): it resumes the
    in-process checkpoint over Flower, sending each node its client state first, bit for bit."""
    from flwr.app import Context, RecordDict

    from strategies.server_app import make_server_app
    from tests.helpers.flower_utils import LoopbackGrid, task_identity

    keys = CASES["pvi-sequential"]  # client-held factors
    full = _run(keys, tmp_path / "full", 6)
    _run(keys, tmp_path / "half", 3)
    run_config = {**BASE, **keys, "num-rounds": 6, "output-dir": str(tmp_path / "half"),
                  "resume": str(tmp_path / "half")}  # what both apps read under flwr run
    grid = LoopbackGrid(build_experiment(parse_run_config(run_config)))
    app = make_server_app(run_config, engine="simulation", progress=False)
    with task_identity():
        app(grid, Context(1, 0, {}, RecordDict(), {}))
    assert [pid for pid, action in grid.actions if action == C.STATE_PUT] == [0, 1, 2]
    resumed = json.loads((tmp_path / "half" / "result.json").read_text())
    assert resumed["engine"] == "simulation"
    _assert_same_run(full, resumed, tmp_path / "full", tmp_path / "half")


# ---------------------------------------------------------------------------- the CLI, killed
CLI_KEYS = ["--algorithm", "pvi", "--model", "logistic-regression", "--dataset", "breast-cancer",
            "--num-clients", "4", "--partition", "iid", "--seed", "3",
            "--run-config", "local-optimiser='adam' local-steps=300 mc-samples=5"]


def _cli(*argv, **kwargs):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "run_simulation.py"), "--quiet",
                             *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT}, **kwargs)


@pytest.mark.slow
def test_cli_killed_mid_round_resumes_from_its_last_checkpoint(tmp_path):
    """SIGKILL the in-process CLI during update 3 or later; ``--resume`` continues from the last
    checkpoint and the result equals an uninterrupted run bit for bit; nothing is left
    running."""
    out = tmp_path / "run"
    proc = _cli("--engine", "in-process", *CLI_KEYS, "--num-rounds", "40", "--output-dir",
                str(out), start_new_session=True)
    stored, children = _kill_when_checkpointed(proc, out, 2)
    assert 2 <= stored < 40
    assert json.loads((out / "result.json").read_text())["outcome"] == "running"
    resumed = _cli("--engine", "in-process", "--resume", str(out), "--num-rounds",
                   str(stored + 2))
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert [r["round"] for r in result["history"]] == list(range(1, stored + 3))
    keys = {"algorithm": "pvi", "model": "logistic-regression", "dataset": "breast-cancer",
            "num-clients": 4, "partition": "iid", "seed": 3, "local-optimiser": "adam",
            "local-steps": 300, "mc-samples": 5, "num-rounds": stored + 2,
            "output-dir": str(tmp_path / "ref")}
    ref = run_in_process(parse_run_config(keys), progress=False)
    _assert_same_run(ref, result, tmp_path / "ref", out)
    assert not [p for p in children | {proc.pid} if processes.alive(p)]


def test_cli_resume_takes_only_num_rounds(tmp_path):
    _run({"algorithm": "sgld"}, tmp_path, 1)
    proc = _cli("--engine", "in-process", "--resume", str(tmp_path), "--seed", "2")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "drop --seed" in stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------------------- the Flower strategy
def _strategy(keys: dict, rounds: int, grid=None, resume=None, on_checkpoint=None,
              on_record=None):
    """Run the generic Flower strategy over a :class:`flower_utils.LoopbackGrid`;
    ``(strategy, grid, checkpoints)`` with every checkpoint it made."""
    from strategies.server_app import strategy_for
    from tests.helpers.flower_utils import LoopbackGrid, task_identity

    exp = build_experiment(parse_run_config({**BASE, **keys}))
    strategy = strategy_for(exp)
    grid = grid or LoopbackGrid(exp)
    made: list = []

    def checkpoint(update, state, clients, versions, virtual_time, dead):
        made.append(C.Checkpoint(exp.bundle.name, "simulation", {}, update, state, clients,
                                 versions, counters={"dead": dead}))
        if on_checkpoint is not None:
            on_checkpoint(update, grid)

    strategy.on_checkpoint = checkpoint
    if resume is not None:
        strategy.resume(resume)
    with task_identity():
        strategy.start(grid, num_rounds=rounds,
                       evaluate_fn=lambda u, a: on_record and on_record(u, grid))
    return strategy, grid, made


@pytest.mark.parametrize("case", ["pvi-sequential", "u-dsvgd"])
def test_strategy_resume_puts_client_states_back_exactly(case, tmp_path):
    """Over Flower, a resumed run starts with empty nodes; the strategy sends each partition
    its stored client state first, and the result equals the uninterrupted in-process run bit
    for bit. Without that restore the nodes would refuse (their version is behind)."""
    keys = CASES[case]
    _, _, made = _strategy(keys, 3)
    C.save(str(tmp_path), made[-1])
    ckpt = C.load(str(tmp_path))  # through the file
    assert ckpt.update == 3 and sum(ckpt.client_versions) > 0
    resumed, grid, _ = _strategy(keys, 6, resume=ckpt)
    puts = [pid for pid, action in grid.actions if action == C.STATE_PUT]
    assert puts == list(range(3))  # each node got its state back before the first exchange
    _run(keys, tmp_path / "local", 6)
    resumed.posterior.save(str(tmp_path / "flower.npz"))
    with np.load(tmp_path / "local" / "posterior.npz") as a, np.load(tmp_path / "flower.npz") as b:
        assert a.files == b.files
        for key in a.files:  # bit for bit
            assert np.array_equal(a[key], b[key]), key


def test_strategy_restores_a_node_that_lost_its_state(tmp_path):
    """A node whose ``context.state`` is wiped after a checkpoint (a SuperNode restart) refuses
    its next request instead of answering from t_k = 1 (which would count its data twice); the
    server puts the checkpointed state back and the node takes part again. Sequential PVI
    (client-held factors): q = p x prod_k t_k still holds at the end."""
    from flwr.app import RecordDict

    keys = {**CASES["pvi-sequential"], "num-clients": 4}

    def wipe(update, grid):
        if update == 2:  # after update 2's checkpoint: the node of partition 1 restarts
            grid.contexts[101].state = RecordDict()

    strategy, grid, _ = _strategy(keys, 8, on_checkpoint=wipe)
    assert strategy.outcome == "completed"
    from clients.handler import state_key
    from fedbayes_flwr import codec

    exp = build_experiment(parse_run_config({**BASE, **keys}))
    refused = [r for u, log in strategy.round_logs.items() for r in log.rejected]
    assert len(refused) == 1 and refused[0].partition_id == 1
    assert C.STATE_LOST in refused[0].reason
    puts = [i for i, (pid, action) in enumerate(grid.actions) if action == C.STATE_PUT]
    assert [grid.actions[i][0] for i in puts] == [1]  # restored once ...
    after = [action for pid, action in grid.actions[puts[0] + 1:] if pid == 1]
    assert "train" in after  # ... and asked to train again afterwards
    state = strategy.state
    product = state.prior
    template = exp.bundle.client_state_template(exp.setup)
    for pid in range(4):
        client = codec.load_state(grid.contexts[100 + pid].state, state_key(exp), template)
        product = G.add(product, _factor(client, int(state.accepted_round[pid])))
    # a handful of float64 additions of natural parameters of order 1e2
    np.testing.assert_allclose(product.eta1, state.posterior.eta1, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(product.eta2, state.posterior.eta2, rtol=1e-10, atol=1e-10)


def _kill_when_checkpointed(proc, out, at_least: int, timeout: float = 400) -> tuple[int, set]:
    """SIGKILL ``proc`` once its checkpoint holds ``at_least`` updates; ``(stored update, the
    descendants it had)``."""
    deadline, update = time.monotonic() + timeout, 0
    while update < at_least and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        try:
            update = C.load(str(out)).update
        except C.CheckpointError:
            pass
    assert update >= at_least, proc.stderr.read()[-3000:] if proc.poll() is not None else "late"
    time.sleep(0.2)  # into the next update
    children = processes.descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    return C.load(str(out)).update, children


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.deployment  # SIGKILLs a Simulation Engine process tree: with the process tests
def test_simulation_killed_mid_round_resumes_exactly_and_leaves_nothing(tmp_path):
    """The Simulation Engine CLI (sequential PVI: client-held factors, restored to the new run's
    nodes) killed with SIGKILL: every process it started (Ray's GCS, raylet, agents, actors) is
    gone within seconds (the CLI's watchdog), and ``--resume`` gives the uninterrupted run's
    posterior and history bit for bit."""
    out = tmp_path / "run"
    keys = ["--algorithm", "pvi", "--model", "linear-regression", "--dataset", "synthetic",
            "--num-clients", "3", "--partition", "iid", "--seed", "1", "--run-config",
            "pvi.schedule='sequential' client-delay=0.3"]  # slow enough to be killed mid-run
    proc = _cli("--engine", "simulation", "--num-cpus-per-client", "1", *keys,
                "--num-rounds", "60", "--output-dir", str(out), start_new_session=True)
    stored, children = _kill_when_checkpointed(proc, out, 2)
    assert children  # Ray's processes
    deadline = time.monotonic() + 20  # the watchdog: SIGTERM, 3 s, SIGKILL
    while [p for p in children if processes.alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children | {proc.pid} if processes.alive(p)]
    resumed = _cli("--engine", "simulation", "--num-cpus-per-client", "1", "--resume", str(out),
                   "--num-rounds", str(stored + 2))
    _, stderr = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["engine"] == "simulation"
    ref = _run({"algorithm": "pvi", "pvi.schedule": "sequential", "client-delay": 0.3},
               tmp_path / "ref", stored + 2)
    _assert_same_run(ref, result, tmp_path / "ref", out)


def test_strategy_leaves_out_a_node_that_lost_its_state_mid_update():
    """A node wiped after its last request of update 2 but before update 2's checkpoint has
    moved past the last checkpoint: nothing can put it back exactly, so the partition is left
    out of the rest of the run (recorded, never sent another request) rather than answering
    from a fresh factor."""
    from flwr.app import RecordDict

    keys = {**CASES["pvi-sequential"], "num-clients": 4}

    def wipe(update, grid):
        if update == 2:  # before the checkpoint's client-state query
            grid.contexts[101].state = RecordDict()

    strategy, grid, made = _strategy(keys, 6, on_record=wipe)
    assert strategy.outcome == "completed" and strategy.dead == {1}
    # every checkpoint from update 2 on records partition 1 as out (a resume leaves it out),
    # with its last checkpointed state (update 1's), not the wiped one
    assert [c.counters["dead"] for c in made] == [[]] + [[1]] * 5
    assert all(c.client_versions[1] == made[0].client_versions[1] for c in made)
    assert C.STATE_LOST in strategy.failed[1].reason
    after = [action for pid, action in grid.actions if pid == 1]
    assert after[-1] == C.STATE_GET  # the query that found it behind; then nothing
    later = [r for u in range(3, 7) for r in strategy.round_logs[u].rejected]
    assert {r.partition_id for r in later} <= {1} and all("not sent" in r.reason for r in later)


def _assert_factors_make_posterior(state, client_states) -> None:
    """q = p x prod_k t_k (Ashman et al. 2022, eq. 1) for client-held factors."""
    product = state.prior
    for pid, client in enumerate(client_states):
        product = G.add(product, _factor(client, int(state.accepted_round[pid])))
    # a few float64 additions of natural parameters of order 1e2: round-off ~1e-13 relative
    np.testing.assert_allclose(product.eta1, state.posterior.eta1, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(product.eta2, state.posterior.eta2, rtol=1e-10, atol=1e-10)


def test_strategy_asynchronous_checkpoints_are_consistent_and_resume(tmp_path):
    """Asynchronous PVI over the strategy: a checkpoint of update U waits for each node busy at
    U to finish its in-flight request, and every checkpoint it writes satisfies q = p x prod
    t_k with the factors it stores; a run resumed from the last one continues consistently."""
    keys = {"algorithm": "pvi", "pvi.schedule": "asynchronous", "pvi.damping": 0.5,
            "num-clients": 4}
    _, _, made = _strategy(keys, 12)
    assert len(made) >= 2  # each waits for the 3 nodes busy at its update: ~4 updates
    assert [c.update for c in made] == sorted({c.update for c in made})
    for ckpt in made:
        _assert_factors_make_posterior(ckpt.server_state, ckpt.client_states)
    resumed, grid, again = _strategy(keys, 20, resume=made[-1])
    assert resumed.outcome == "completed" and resumed._update == 20
    for ckpt in again:
        _assert_factors_make_posterior(ckpt.server_state, ckpt.client_states)


def test_in_process_checkpoint_resumes_over_flower_exactly(tmp_path):
    """A checkpoint written by the in-process engine (no client versions) resumes through the
    Flower strategy: the nodes get its client states back at version 0, bit for bit."""
    keys = CASES["pvi-sequential"]
    _run(keys, tmp_path / "half", 3)
    resumed, grid, _ = _strategy(keys, 6, resume=C.load(str(tmp_path / "half")))
    assert [pid for pid, action in grid.actions if action == C.STATE_PUT] == [0, 1, 2]
    _run(keys, tmp_path / "full", 6)
    resumed.posterior.save(str(tmp_path / "flower.npz"))
    with np.load(tmp_path / "full" / "posterior.npz") as a, np.load(tmp_path / "flower.npz") as b:
        for key in a.files:  # bit for bit
            assert np.array_equal(a[key], b[key]), key
