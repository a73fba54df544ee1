"""Acceptance: the docs' ``flwr run .`` commands (docs/getting-started.md) work verbatim from an
empty ``FLWR_HOME``, and a new user's first try (Flower's default 2 simulated nodes for a
10-partition run) fails fast with one line saying how to fix it.

The commands are extracted from the page (so docs and code cannot drift) and each runs in a fresh
``bash -l`` in a copy of the app after the README's activation line (``source .venv/bin/activate``;
the copy's ``.venv`` links to the tests' environment, which simulates the set-up, and the shell's
``PATH`` holds no trace of it before activation: nothing substitutes ``flwr``), with a private,
EMPTY ``FLWR_HOME`` (Flower creates its local SuperLink connection), free ports, runtime dependency
installation disabled; the detached local SuperLink is stopped by PID in ``finally``.
``flwr run --stream`` exits 0 even when the ServerApp fails, so each run's status is read with
``flwr ls``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from tests.helpers.doc_blocks import ACTIVATE, VENV, blocks, login_env
from tests.helpers.flower_utils import (
    REPO,
    copy_app,
    describe,
    flwr_env,
    free_port,
    local_superlink_pids,
    processes_of,
    run_cli,
    started_run_id,
    stop_flower,
    wait_finished,
)

pytestmark = [
    pytest.mark.flower,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds PIDs in /proc"),
]

RUN_TIMEOUT_S = 240
FLWR_COMMANDS = [line.strip() for block in blocks("docs/getting-started.md") if block.lang == "bash"
                 for line in block.code.splitlines() if line.strip().startswith("flwr run")]


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): _sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file() and not {"__pycache__", "runs", ".venv"} & set(p.parts)}


def _output_dir(command: str) -> str:
    return re.search(r"output-dir='\$PWD/([^']+)'", command).group(1)


def test_docs_have_the_eight_flwr_commands():
    assert len(FLWR_COMMANDS) == 8, FLWR_COMMANDS
    assert all("$PWD/" in c and "--federation-config" in c for c in FLWR_COMMANDS)
    # the resume command is the DSVGD command with resume= and a larger num-rounds
    first, again = FLWR_COMMANDS[2], FLWR_COMMANDS[3]
    dsvgd_dir = _output_dir(first)
    assert again == first.replace("num-rounds=2", "num-rounds=3").replace(
        f"output-dir='$PWD/{dsvgd_dir}'", f"output-dir='$PWD/{dsvgd_dir}' resume='$PWD/{dsvgd_dir}'")


@pytest.mark.deployment  # starts Flower's detached local SuperLink; ~3 min: out of the default suite
def test_docs_flwr_run_commands_verbatim_and_too_few_nodes_fail_fast(tmp_path):
    repo_pyproject = _sha256(REPO / "pyproject.toml")
    flwr_home = tmp_path / "flwr-home"
    flwr_home.mkdir()  # empty: no config.toml, as on a new user's machine
    app = copy_app(tmp_path / "app")
    (app / ".venv").symlink_to(VENV, target_is_directory=True)  # the set-up, simulated
    app_tree = _tree(app)
    log = tmp_path / "flwr-cli.log"
    env = flwr_env(flwr_home, superlink_port=free_port(), control_port=free_port())
    entries, superlink_pids = [], []
    try:
        # the same private FLWR_HOME and ports, without the venv's bin on PATH (login_env)
        shell_env = login_env(**{k: v for k, v in env.items() if k != "PATH"})
        for command in FLWR_COMMANDS:  # verbatim, in bash -l ($PWD expands to the app copy)
            proc = run_cli(["bash", "-l", "-c", f"{ACTIVATE} && {command}"], shell_env, cwd=app,
                           timeout=RUN_TIMEOUT_S, log=log)
            assert proc.returncode == 0, proc.stdout[-4000:]
            entry = wait_finished(started_run_id(proc.stdout), env, cwd=app, deadline_s=60,
                                  log=log)
            entries.append(entry)
            assert entry["status"] == "finished:completed", (entry, proc.stdout[-4000:])
        superlink_pids = local_superlink_pids(flwr_home)
        # A new user's first try: 10 partitions (the default) on Flower's default 2 nodes.
        out = tmp_path / "too-few"
        started = time.monotonic()
        proc = run_cli(["flwr", "run", ".", "--stream", "--run-config", f"output-dir='{out}'"],
                       env, cwd=app, timeout=RUN_TIMEOUT_S, log=log)
        entry = wait_finished(started_run_id(proc.stdout), env, cwd=app, deadline_s=60, log=log)
        took = time.monotonic() - started
    finally:
        if log.exists():
            print(log.read_text()[-8000:])  # shown by pytest when the test fails
        stopped = stop_flower(flwr_home)
        leftover = processes_of(flwr_home)
        assert not leftover, f"Flower processes left running:\n{describe(leftover)}"
        assert set(superlink_pids) <= set(stopped)

    assert entry["status"] == "finished:failed", entry
    details = entry["status-details"]
    assert "no connected node serves partition ids [2, 3, ..., 9]: 2 node(s)" in details, details
    assert 'num-supernodes=10' in details and "num-partitions=2" in details
    # the ServerApp fails within 30 s of starting to run (Flower's own start-up comes before)
    assert entry["compute-time"]["serverapp-seconds"] < 30, (took, entry)

    # The repo's app is untouched, and so is the copy (no federations section to migrate).
    assert _sha256(REPO / "pyproject.toml") == repo_pyproject
    assert _tree(app) == app_tree

    # The default-model command: 3 rounds, 10 clients, every reply accepted.
    default = json.loads((app / _output_dir(FLWR_COMMANDS[0]) / "result.json").read_text())
    assert [row["round"] for row in default["history"]] == [1, 2, 3]
    assert default["num_clients"] == 10 and default["outcome"] == "completed"
    assert all(row["rejected_replies"] == 0 and row["clients"] == list(range(10))
               for row in default["history"])
    # The linear command: dotted pvi.damping reached the apps; exact after one round.
    out_dir = app / _output_dir(FLWR_COMMANDS[1])
    result = json.loads((out_dir / "result.json").read_text())
    assert result["engine"] == "simulation" and result["run_config"]["pvi.damping"] == 1.0
    assert result["num_clients"] == 3 and len(result["history"]) == 2
    exp = build_experiment(parse_run_config({"model": "linear-regression", "dataset": "synthetic",
                                             "num-clients": 3, "pvi.damping": 1.0}))
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train,
                                   exp.dataset.y_train)
    mean, cov = G.to_moments(exact)
    with np.load(out_dir / "posterior.npz") as post:
        np.testing.assert_allclose(post["mean"], mean, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(post["cov"], cov, rtol=1e-6, atol=1e-12)

    # The DSVGD command, then its resume to 3 updates (the nodes' particles put back over
    # Flower): the particles equal those of 3 uninterrupted in-process updates.
    out_dir = app / _output_dir(FLWR_COMMANDS[2])
    result = json.loads((out_dir / "result.json").read_text())
    assert result["algorithm"] == "dsvgd" and result["outcome"] == "completed"
    assert [row["round"] for row in result["history"]] == [1, 2, 3]
    assert result["run_config"]["resume"] == str(out_dir)
    keys = {"algorithm": "dsvgd", "num-clients": 2, "num-rounds": 3, "dataset": "twonorm",
            "dsvgd.num-particles": 6, "dsvgd.local-iterations": 50,
            "dsvgd.distillation-iterations": 50, "output-dir": str(tmp_path / "dsvgd-local")}
    run_in_process(parse_run_config(keys), progress=False)
    with (np.load(out_dir / "posterior.npz") as post,
          np.load(tmp_path / "dsvgd-local" / "posterior.npz") as local):
        assert post["samples"].shape == (6, 21)
        np.testing.assert_allclose(post["samples"], local["samples"], rtol=0, atol=1e-6)

    # The AMPS command: one round on ten nodes; the merged mixture equals the in-process merge.
    out_dir = app / _output_dir(FLWR_COMMANDS[4])
    result = json.loads((out_dir / "result.json").read_text())
    assert result["algorithm"] == "amps" and result["outcome"] == "completed"
    assert result["history"][0]["clients"] == list(range(10))
    keys = {"algorithm": "amps", "model": "gmm", "dataset": "amps-mixture", "num-clients": 10,
            "partition": "iid", "noise-scale": 0.3, "prior-scale": 1.4142135623730951,
            "output-dir": str(tmp_path / "amps-local")}
    run_in_process(parse_run_config(keys), progress=False)
    with (np.load(out_dir / "posterior.npz") as post,
          np.load(tmp_path / "amps-local" / "posterior.npz") as local):
        for key in ("means.h", "means.prec", "weights.alpha"):
            np.testing.assert_allclose(post[key], local[key], rtol=1e-9, atol=1e-12)

    # The PDMC command: events through flwr run; the chains and skeleton equal in-process.
    out_dir = app / _output_dir(FLWR_COMMANDS[5])
    result = json.loads((out_dir / "result.json").read_text())
    assert result["algorithm"] == "pdmc" and result["outcome"] == "done"
    keys = {"algorithm": "pdmc", "model": "gaussian-mean", "dataset": "synthetic",
            "num-clients": 4, "partition": "iid", "synthetic-dim": 2, "synthetic-size": 40,
            "pdmc.num-chains": 4, "pdmc.process-time": 1.0,
            "output-dir": str(tmp_path / "pdmc-local")}
    run_in_process(parse_run_config(keys), progress=False)
    with (np.load(out_dir / "posterior.npz") as post,
          np.load(tmp_path / "pdmc-local" / "posterior.npz") as local):
        for key in ("chains", "skeleton_time", "skeleton_x"):
            np.testing.assert_allclose(post[key], local[key], rtol=0, atol=1e-9)

    # The decentralized HMC command: gossip over a path of 3; equal to in-process.
    out_dir = app / _output_dir(FLWR_COMMANDS[6])
    result = json.loads((out_dir / "result.json").read_text())
    assert result["algorithm"] == "dhmc" and result["outcome"] == "completed"
    keys = {"algorithm": "dhmc", "model": "linear-regression", "dataset": "synthetic",
            "num-clients": 3, "partition": "iid", "synthetic-dim": 2, "synthetic-size": 60,
            "dhmc.graph": "path", "dhmc.num-chains": 4, "dhmc.warmup": 5, "dhmc.iterations": 10,
            "dhmc.mixing-rounds": 1, "output-dir": str(tmp_path / "dhmc-local")}
    run_in_process(parse_run_config(keys), progress=False)
    with (np.load(out_dir / "posterior.npz") as post,
          np.load(tmp_path / "dhmc-local" / "posterior.npz") as local):
        assert post["agent_samples"].shape == (3, 4, 10, 2)
        np.testing.assert_allclose(post["agent_samples"], local["agent_samples"], rtol=0,
                                   atol=1e-9)

    # The DP-PVI command: the epsilon spent comes back in result.json, within its target, and
    # the run equals in-process (the noise is drawn from the round's seeds on each node).
    out_dir = app / _output_dir(FLWR_COMMANDS[7])
    result = json.loads((out_dir / "result.json").read_text())
    assert result["outcome"] == "completed" and result["run_config"]["pvi.dp"] == "dp-sgd"
    assert 3.9 < result["final"]["dp_epsilon"] <= 4.0 and result["final"]["dp_delta"] == 1e-5
    assert all(0 < row["dp_epsilon"] <= 4.0 for row in result["history"])
    keys = {"num-clients": 3, "num-rounds": 2, "pvi.dp": "dp-sgd", "pvi.dp-epsilon": 4.0,
            "pvi.dp-delta": 1e-5, "pvi.damping": 0.1, "pvi.batch-size": 10, "pvi.local-steps": 20,
            "pvi.learning-rate": 0.01, "pvi.mc-samples": 4, "output-dir": str(tmp_path / "dp-local")}
    local_result = run_in_process(parse_run_config(keys), progress=False)
    assert result["final"]["dp_epsilon"] == local_result["final"]["dp_epsilon"]
    with (np.load(out_dir / "posterior.npz") as post,
          np.load(tmp_path / "dp-local" / "posterior.npz") as local):
        np.testing.assert_allclose(post["mean"], local["mean"], rtol=1e-9, atol=1e-12)
