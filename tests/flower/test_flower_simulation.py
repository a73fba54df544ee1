"""Tier 4: the Flower glue adds no maths.

The same seed run through Flower's Simulation Engine and in-process gives the same posterior and
the same metrics, including a client whose NaN reply is rejected by the strategy.
"""

import json
import os
import re
import sys

import numpy as np
import pytest

from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from tests.helpers.flower_utils import run_while_busy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.flower

LOGISTIC = ["--model", "logistic-regression", "--dataset", "breast-cancer", "--num-clients", "4",
            "--partition", "dirichlet", "--partition-alpha", "0.5", "--num-rounds", "3",
            "--seed", "5"]
# a proximal weight, so the server's per-round value travels in the step messages too
LOGISTIC_RC = "local-steps=80 mc-samples=5 inject-fault='nan@2:1' pvi.proximal=0.5"
# the same settings as run-config keys, for the in-process runs
LOGISTIC_KEYS = {"model": "logistic-regression", "dataset": "breast-cancer", "num-clients": 4,
                 "partition": "dirichlet", "partition-alpha": 0.5, "num-rounds": 3, "seed": 5,
                 "local-steps": 80, "mc-samples": 5, "inject-fault": "nan@2:1",
                 "pvi.proximal": 0.5}


def _simulate(out, argv, run_config, cpus="1"):
    env = {**os.environ, "PYTHONPATH": ROOT}
    # a loaded machine may take minutes to start the Ray actors: the wait goes on while the
    # run's processes work, and a hang (idle processes) fails after at most 400 s + 30 s
    proc = run_while_busy(
        [sys.executable, os.path.join(ROOT, "run_simulation.py"), "--engine", "simulation",
         "--quiet", "--output-dir", str(out), "--num-cpus-per-client", cpus, *argv,
         "--run-config", run_config], base_s=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the driver's own output is plain: no colour-coded log lines in a log file, no deprecation
    # notice (Ray actors' start-up lines, prefixed "(pid=...)", are Ray's own log forwarding and
    # stay; a Ray exception text may carry its own colours inside an ERROR line)
    driver = [ln for ln in proc.stderr.splitlines() if not ln.startswith("(")]
    coloured = re.compile(r"^\x1b\[[0-9;]*m(INFO|WARNING|ERROR|DEBUG)")  # Flower's log prefix
    assert not [ln for ln in driver if coloured.match(ln) or "DEPRECATED" in ln], driver[:20]
    assert not [ln for ln in driver if ln.startswith(("I0000", "WARNING: All log"))], driver[:20]
    # ... and no TensorFlow/CUDA start-up line from the driver or any Ray actor (before the
    # workers' setup hook every actor printed the absl banner, oneDNN, cudart and cuInit lines)
    assert not tensorflow_lines(proc.stderr + proc.stdout), tensorflow_lines(proc.stderr)[:10]
    return json.loads((out / "result.json").read_text()), np.load(out / "posterior.npz")


# TensorFlow's and CUDA's start-up lines (absl banner, oneDNN, cudart stub, cuInit) and the
# actors' shutdown notice: none may reach the console, from the driver or any Ray actor.
NOISE = ("absl::InitializeLog", "oneDNN custom operations", "Could not find cuda drivers",
         "cuInit", "cpu_feature_guard", "Manually terminating ClientAppActor")


def tensorflow_lines(console: str) -> list[str]:
    """The console lines that carry one of :data:`NOISE`."""
    return [ln for ln in console.splitlines() if any(n in ln for n in NOISE)]


def _comparable(history):
    return [{k: v for k, v in h.items() if k != "elapsed_s"} for h in history]


def test_simulation_equals_in_process_with_rejected_nan_reply(tmp_path):
    flower, flower_post = _simulate(tmp_path / "flower", LOGISTIC, LOGISTIC_RC)
    local = run_in_process(parse_run_config({**LOGISTIC_KEYS,
                                             "output-dir": str(tmp_path / "local")}),
                           progress=False)
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    assert flower["engine"] == "simulation" and local["engine"] == "in-process"
    for key in ("mean", "cov"):
        np.testing.assert_allclose(flower_post[key], local_post[key], rtol=0, atol=1e-6)
    # identical metrics, byte counts and rejections round by round
    assert _comparable(flower["history"]) == _comparable(local["history"])
    assert [h["rejected_replies"] for h in flower["history"]] == [0, 1, 0]
    assert [h["diagnostics"]["pvi_proximal"] for h in flower["history"]] == [0.5] * 3
    assert flower["history"][1]["rejections"][0]["field"] == "delta.eta1"
    # ... and the run equals one where that reply never arrived
    dropped = run_in_process(parse_run_config({**LOGISTIC_KEYS, "inject-fault": "drop@2:1",
                                               "output-dir": str(tmp_path / "drop")}),
                             progress=False)
    drop_post = np.load(tmp_path / "drop" / "posterior.npz")
    np.testing.assert_allclose(flower_post["mean"], drop_post["mean"], rtol=0, atol=1e-6)
    assert dropped["final"]["test_nll"] == pytest.approx(flower["final"]["test_nll"], abs=1e-9)


def test_client_exception_is_counted_and_run_recovers_exactly(tmp_path):
    """A ClientApp that raises in round 1 is rejected; in round 2 it adds its factor once.
    Recorded every 2 updates (``eval-every``): the Flower rows equal the in-process rows."""
    argv = ["--model", "linear-regression", "--dataset", "diabetes", "--num-clients", "3",
            "--num-rounds", "4", "--partition", "iid"]
    result, post = _simulate(tmp_path / "err", argv,
                             "damping=1.0 eval-every=2 inject-fault='error@1:2'")
    assert [h["round"] for h in result["history"]] == [2, 4]
    assert [h["rejected_replies"] for h in result["history"]] == [1, 0]
    assert "client error" in result["history"][0]["rejections"][0]["reason"]
    local = run_in_process(parse_run_config({
        "model": "linear-regression", "dataset": "diabetes", "num-clients": 3, "num-rounds": 4,
        "partition": "iid", "damping": 1.0, "eval-every": 2, "inject-fault": "error@1:2",
        "output-dir": str(tmp_path / "local")}), progress=False)
    keep = ("round", "test_rmse", "test_nll", "log_marginal_likelihood", "bytes_down",
            "bytes_up", "clients")
    assert ([{k: h[k] for k in keep} for h in result["history"]]
            == [{k: h[k] for k in keep} for h in local["history"]])
    from fedbayes_flwr import models
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.runtime.experiment import build_experiment

    exp = build_experiment(parse_run_config({"model": "linear-regression", "dataset": "diabetes",
                                             "num-clients": 3, "partition": "iid"}))
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)
    mean, cov = G.to_moments(exact)
    np.testing.assert_allclose(post["mean"], mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(post["cov"], cov, rtol=1e-6, atol=1e-12)


def test_asynchronous_pvi_applies_straggler_on_arrival_through_flower(tmp_path):
    """Real delays in the Simulation Engine: 3 clients answer in 0.3 s, the straggler in 1.5 s.
    Updates are applied one reply at a time as they are pulled: the fast clients go on updating
    while the straggler computes, its update lands when it arrives, and the run ends exact."""
    argv = ["--model", "linear-regression", "--dataset", "diabetes", "--num-clients", "4",
            "--num-rounds", "20", "--partition", "iid"]
    rc = "schedule='asynchronous' damping=1.0 client-delay=0.3 stragglers='3' straggler-factor=5.0"
    result, post = _simulate(tmp_path / "async", argv, rc, cpus="0.5")  # 4 concurrent actors
    history = result["history"]
    assert len(history) == 20 and all(len(h["clients"]) == 1 for h in history), [
        (h["round"], h["clients"], h.get("rejections")) for h in history]
    order = [h["clients"][0] for h in history]
    first_straggler = order.index(3)
    for fast in (0, 1, 2):  # they kept going while the straggler was busy: no barrier
        assert order[:first_straggler].count(fast) >= 2, order
    times = [h["virtual_time"] for h in history]
    assert times == sorted(times) and times[first_straggler] >= 1.5
    from fedbayes_flwr import models
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.runtime.experiment import build_experiment

    exp = build_experiment(parse_run_config({"model": "linear-regression", "dataset": "diabetes",
                                             "num-clients": 4, "partition": "iid"}))
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)
    np.testing.assert_allclose(post["mean"], G.to_moments(exact)[0], rtol=1e-6, atol=1e-9)


def test_p_dsvgd_simulation_equals_in_process_with_rejected_reply(tmp_path):
    """DSVGD's particles through the Simulation Engine equal the in-process particles to 1e-6:
    two clients per round (the server's merge), a NaN reply rejected in round 2 (its factor not
    committed: round 3's replies still agree), and byte counts row by row."""
    argv = ["--algorithm", "p-dsvgd", "--model", "logistic-regression", "--dataset",
            "breast-cancer", "--num-clients", "2", "--num-rounds", "3", "--partition", "iid",
            "--seed", "3"]
    rc = ("num-particles=8 local-iterations=15 distillation-iterations=15 batch-size=50 "
          "inject-fault='nan@2:1'")
    flower, flower_post = _simulate(tmp_path / "flower", argv, rc)
    local = run_in_process(parse_run_config({
        "algorithm": "p-dsvgd", "model": "logistic-regression", "dataset": "breast-cancer",
        "num-clients": 2, "num-rounds": 3, "partition": "iid", "seed": 3, "num-particles": 8,
        "local-iterations": 15, "distillation-iterations": 15, "batch-size": 50,
        "inject-fault": "nan@2:1", "output-dir": str(tmp_path / "local")}), progress=False)
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    assert flower_post["samples"].shape == (8, 31)
    np.testing.assert_allclose(flower_post["samples"], local_post["samples"], rtol=0, atol=1e-6)
    assert _comparable(flower["history"]) == _comparable(local["history"])
    assert [h["rejected_replies"] for h in flower["history"]] == [0, 1, 0]
    assert flower["history"][1]["rejections"][0]["field"] == "particles"
    assert all(h["bytes_up"] > 0 and h["bytes_down"] > 0 for h in flower["history"])


def test_fedavg_paper_size_query_and_rounds_equal_in_process(tmp_path):
    """The paper's FedAvg opens with a ``query`` exchange (each client's row count) before round
    1: through the Simulation Engine the point estimate and every history row equal the
    in-process run."""
    argv = ["--algorithm", "fedavg-paper", "--num-clients", "2", "--num-rounds", "3",
            "--seed", "4"]
    flower, flower_post = _simulate(tmp_path / "flower", argv, "local-steps=20")
    local = run_in_process(parse_run_config({
        "algorithm": "fedavg-paper", "num-clients": 2, "num-rounds": 3, "seed": 4,
        "local-steps": 20, "output-dir": str(tmp_path / "local")}), progress=False)
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    np.testing.assert_allclose(flower_post["samples"], local_post["samples"], rtol=0, atol=1e-6)
    assert _comparable(flower["history"]) == _comparable(local["history"])
    assert [h["clients"] for h in flower["history"]] == [[0], [1], [0]]


def _without_timings(history):
    """History rows without wall-clock fields (merge and fitting seconds differ between runs)."""
    out = []
    for row in _comparable(history):
        row = {k: v for k, v in row.items() if k != "merge_seconds"}
        if "diagnostics" in row:
            row["diagnostics"] = {k: v for k, v in row["diagnostics"].items()
                                  if not k.startswith("fit_seconds")}
        out.append(row)
    return out


def test_amps_latent_features_moments_query_and_rejection_equal_in_process(tmp_path):
    """AMPS on the latent-feature model through the Simulation Engine: the moments query (the
    shared prior precision), one client's invalid posterior rejected, the merge of the other two
    equal the in-process run."""
    argv = ["--algorithm", "amps", "--model", "latent-feature", "--dataset", "latent-features",
            "--num-clients", "3", "--partition", "iid", "--noise-scale", "0.2", "--seed", "2"]
    rc = "components=5 restarts=1 inject-fault='negative-precision@1:2'"
    flower, flower_post = _simulate(tmp_path / "flower", argv, rc)
    local = run_in_process(parse_run_config({
        "algorithm": "amps", "model": "latent-feature", "dataset": "latent-features",
        "num-clients": 3, "partition": "iid", "noise-scale": 0.2, "seed": 2, "components": 5,
        "restarts": 1, "inject-fault": "negative-precision@1:2",
        "output-dir": str(tmp_path / "local")}), progress=False)
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    for key in ("features.h", "features.prec", "probs.a", "probs.b"):
        np.testing.assert_allclose(flower_post[key], local_post[key], rtol=1e-6, atol=1e-9)
    # the same numbers up to summation order (the objective sums log-partitions of ~1e5)
    got, want = _without_timings(flower["history"]), _without_timings(local["history"])
    assert len(got) == len(want) == 1
    assert got[0]["diagnostics"] == pytest.approx(want[0]["diagnostics"], rel=1e-9)
    assert got[0].keys() == want[0].keys()
    for key, value in got[0].items():
        if isinstance(value, float):
            assert value == pytest.approx(want[0][key], rel=1e-9), key
        elif key != "diagnostics":
            assert value == want[0][key], key
    row = flower["history"][0]
    # the row lists the accepted replies of both exchanges: moments (0, 1, 2), then train (0, 1)
    assert row["clients"] == [0, 1, 2, 0, 1] and row["rejected_replies"] == 1
    assert row["diagnostics"]["clients_merged"] == 2
    assert row["diagnostics"]["prior_precision"] > 0


def test_pdmc_events_through_the_simulation_engine_equal_in_process(tmp_path):
    """Fed Zig-Zag through the Simulation Engine: every exchange carries the chains' states and
    the horizon to both workers and back (+inf times included); the samples, skeleton and
    counters equal the in-process run's."""
    argv = ["--algorithm", "pdmc", "--model", "gaussian-mean", "--dataset", "synthetic",
            "--num-clients", "2", "--partition", "iid", "--seed", "3"]
    rc = "synthetic-dim=2 synthetic-size=40 pdmc.num-chains=4 pdmc.process-time=1.5 eval-every=20"
    flower, flower_post = _simulate(tmp_path / "flower", argv, rc)
    local = run_in_process(parse_run_config({
        "algorithm": "pdmc", "model": "gaussian-mean", "dataset": "synthetic", "num-clients": 2,
        "partition": "iid", "seed": 3, "synthetic-dim": 2, "synthetic-size": 40,
        "pdmc.num-chains": 4, "pdmc.process-time": 1.5, "eval-every": 20,
        "output-dir": str(tmp_path / "local")}), progress=False)
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    for key in ("chains", "skeleton_time", "skeleton_x", "skeleton_v"):
        np.testing.assert_allclose(flower_post[key], local_post[key], rtol=0, atol=1e-9)
    assert flower["outcome"] == local["outcome"] == "done"
    keys = ("round", "events", "grad_evals", "process_time", "switching_rate")
    assert [{k: h.get(k) for k in keys} for h in flower["history"]] == \
        [{k: h.get(k) for k in keys} for h in local["history"]]


def test_dhmc_gossip_through_the_simulation_engine_equals_in_process(tmp_path):
    """Decentralized MALA (``dmala``: local decisions) through the Simulation Engine at the
    paper's budget, one mixing round per phase on a ring of 4: every exchange routes only
    neighbours' broadcasts, the agents disagree on some decisions (so the rejection's tracker
    correction travels through Flower's messages), and every agent's iterates equal the
    in-process run's."""
    argv = ["--algorithm", "dmala", "--model", "logistic-regression", "--dataset", "synthetic",
            "--num-clients", "4", "--partition", "iid", "--seed", "1"]
    rc = ("synthetic-dim=2 synthetic-size=120 dhmc.num-chains=3 dhmc.warmup=2 "
          "dhmc.iterations=6 dhmc.mixing-rounds=1 dhmc.step-size=0.3 eval-every=4")
    flower, flower_post = _simulate(tmp_path / "flower", argv, rc)
    local = run_in_process(parse_run_config({
        "algorithm": "dmala", "model": "logistic-regression", "dataset": "synthetic",
        "num-clients": 4, "partition": "iid", "seed": 1, "synthetic-dim": 2,
        "synthetic-size": 120, "dhmc.num-chains": 3, "dhmc.warmup": 2, "dhmc.iterations": 6,
        "dhmc.mixing-rounds": 1, "dhmc.step-size": 0.3, "eval-every": 4,
        "output-dir": str(tmp_path / "local")}), progress=False)
    assert local["history"][-1]["disagreement_rate"] > 0  # the correction path is exercised
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    np.testing.assert_allclose(flower_post["agent_samples"], local_post["agent_samples"],
                               rtol=0, atol=1e-9)
    assert flower["outcome"] == local["outcome"] == "completed"  # warm-up + iterations
    keys = ("round", "iterations", "exchanges", "acceptance_rate", "step_size",
            "disagreement_rate")
    assert [{k: h.get(k) for k in keys} for h in flower["history"]] == \
        [{k: h.get(k) for k in keys} for h in local["history"]]


def test_dhmc_mass_matrix_through_the_simulation_engine_equals_in_process(tmp_path):
    """``dhmc`` with the dense mass matrix (issue 33) through the Simulation Engine: a 24-iteration
    warm-up has the slow window [3, 22), so the agents' statistics travel in Flower's messages,
    the flood agrees them in the agents' ``context.state`` and the last iterations sample with
    the agreed matrix; every agent's iterates equal the in-process run's."""
    argv = ["--algorithm", "dhmc", "--model", "logistic-regression", "--dataset", "synthetic",
            "--num-clients", "3", "--partition", "iid", "--seed", "1"]
    rc = ("synthetic-dim=2 synthetic-size=90 dhmc.num-chains=3 dhmc.warmup=24 "
          "dhmc.iterations=4 dhmc.mixing-rounds=1 dhmc.mass-matrix='dense' eval-every=7")
    flower, flower_post = _simulate(tmp_path / "flower", argv, rc)
    local = run_in_process(parse_run_config({
        "algorithm": "dhmc", "model": "logistic-regression", "dataset": "synthetic",
        "num-clients": 3, "partition": "iid", "seed": 1, "synthetic-dim": 2,
        "synthetic-size": 90, "dhmc.num-chains": 3, "dhmc.warmup": 24, "dhmc.iterations": 4,
        "dhmc.mixing-rounds": 1, "dhmc.mass-matrix": "dense", "eval-every": 7,
        "output-dir": str(tmp_path / "local")}), progress=False)
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    np.testing.assert_allclose(flower_post["agent_samples"], local_post["agent_samples"],
                               rtol=0, atol=1e-9)
    keys = ("round", "iterations", "exchanges", "acceptance_rate", "step_size")
    assert [{k: h.get(k) for k in keys} for h in flower["history"]] == \
        [{k: h.get(k) for k in keys} for h in local["history"]]
