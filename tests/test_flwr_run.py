"""Acceptance: ``flwr run .`` runs the app in Flower's Simulation Engine, end to end.

Private FLWR_HOME (``config.toml`` with a managed local SuperLink on free ports), runtime
dependency installation disabled, the app copied to ``tmp_path`` (``flwr run`` may rewrite a
``pyproject.toml``), the local SuperLink stopped by PID in ``finally``, the run's status checked
with ``flwr ls`` (``flwr run --stream`` exits 0 even when the ServerApp fails) and the posterior
compared with the exact one (linear regression, damping 1: PVI is exact after one round).
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest
from flower_utils import (
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
    write_local_simulation_config,
)

from fedbayes_flwr import gaussian as G
from fedbayes_flwr import models
from fedbayes_flwr.config import parse_run_config
from fedbayes_flwr.experiment import build_experiment

pytestmark = [
    pytest.mark.flower,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds PIDs in /proc"),
]

NUM_CLIENTS = 3
NUM_ROUNDS = 2
RUN_TIMEOUT_S = 150


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): _sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_flwr_run_simulation_engine(tmp_path):
    repo_pyproject = _sha256(REPO / "pyproject.toml")
    flwr_home = tmp_path / "flwr-home"
    app = copy_app(tmp_path / "app")
    app_tree = _tree(app)
    out_dir = (tmp_path / "out").resolve()
    log = tmp_path / "flwr-cli.log"
    write_local_simulation_config(flwr_home, num_supernodes=NUM_CLIENTS, num_cpus=1)
    env = flwr_env(flwr_home, superlink_port=free_port(), control_port=free_port())

    overrides = {"model": "linear-regression", "dataset": "synthetic",
                 "num-rounds": NUM_ROUNDS, "num-clients": NUM_CLIENTS, "damping": 1.0,
                 "output-dir": str(out_dir)}
    assert "'" not in str(out_dir)  # TOML literal string below
    run_config = (f"model='{overrides['model']}' dataset='{overrides['dataset']}' "
                  f"num-rounds={NUM_ROUNDS} num-clients={NUM_CLIENTS} pvi.damping=1.0 "
                  f"output-dir='{out_dir}'")

    superlink_pids: list[int] = []
    try:
        proc = run_cli(["flwr", "run", ".", "--stream", "--run-config", run_config],
                       env, cwd=app, timeout=RUN_TIMEOUT_S, log=log)
        superlink_pids = local_superlink_pids(flwr_home)
        assert proc.returncode == 0, proc.stdout
        run_id = started_run_id(proc.stdout)
        assert len(superlink_pids) == 1, (superlink_pids, describe(processes_of(flwr_home)))

        entry = wait_finished(run_id, env, cwd=app, deadline_s=30, log=log)
        assert entry["status"] == "finished:completed", (entry, proc.stdout)
    finally:
        if log.exists():
            print(log.read_text()[-8000:])  # shown by pytest when the test fails
        stopped = stop_flower(flwr_home)
        leftover = processes_of(flwr_home)
        assert not leftover, f"Flower processes left running:\n{describe(leftover)}"
        assert set(superlink_pids) <= set(stopped)

    # The repo's app is untouched, and so is the copy (no federations section to migrate).
    assert _sha256(REPO / "pyproject.toml") == repo_pyproject
    assert _tree(app) == app_tree

    result = json.loads((out_dir / "result.json").read_text())
    assert len(result["history"]) == NUM_ROUNDS
    assert [row["round"] for row in result["history"]] == list(range(1, NUM_ROUNDS + 1))
    assert result["num_clients"] == NUM_CLIENTS
    assert result["engine"] == "simulation"
    for row in result["history"]:  # every simulated SuperNode answered, every reply accepted
        assert row["clients"] == list(range(NUM_CLIENTS))
        assert row["rejected_replies"] == 0
    assert result["run_config"]["model"] == "linear-regression"

    exp = build_experiment(parse_run_config(overrides))
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train,
                                   exp.dataset.y_train)
    mean, cov = G.to_moments(exact)
    with np.load(out_dir / "posterior.npz") as post:
        np.testing.assert_allclose(post["mean"], mean, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(post["cov"], cov, rtol=1e-6, atol=1e-12)
