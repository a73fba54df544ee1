"""Deployment: ``run_simulation.py --engine deployment`` (a SuperLink with TLS and SuperNode
authentication, one SuperNode per partition, all on 127.0.0.1) and the partition query telling
the truth about nodes that cannot answer it.

The fast tests (no Flower process) check the partition query, the app copy and the
certificates. The ``deployment`` tests start real SuperLink / SuperNode processes: every process
they start carries a unique environment tag, so the test finds exactly its own processes in
``/proc`` and asserts none is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
import uuid

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.deploy import flwr_cli
from fedbayes_flwr.deploy import processes as deploy_processes
from fedbayes_flwr.deploy import run as deploy
from fedbayes_flwr.deploy import tls as deploy_tls
from fedbayes_flwr.deploy import watchdog as processes
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from tests.helpers.flower_utils import REPO, describe, task_identity

LR = {"algorithm": "pvi", "model": "linear-regression", "dataset": "synthetic", "num-clients": 3,
      "partition": "iid", "seed": 0}  # iid: no flwr_datasets import (seconds) in the fast tests
NO_PARTITION = ("<class 'ValueError'>:<'node config lacks 'partition-id' (start the SuperNode "
                "with --node-config \"partition-id=K num-partitions=M\")'>")  # as flwr 1.42 sends


# ------------------------------------------------------------------ the partition query (fast)
class _Grid:
    """A Grid in this process. Node ``100 + p`` serves partition ``p`` through the real client
    handler; the nodes in ``broken`` answer every message with a ClientApp error, as a deployed
    SuperNode started without ``partition-id`` does."""

    def __init__(self, exp, broken=()):
        from flwr.app import Context, RecordDict

        self.exp, self.broken = exp, set(broken)
        self.contexts = {100 + p: Context(1, 100 + p, {"partition-id": p}, RecordDict(), {})
                         for p in range(exp.num_clients)}
        self.replies, self.asked = {}, []

    def get_node_ids(self):
        return list(self.contexts)

    def _answer(self, message):
        from flwr.app import ConfigRecord, Error, Message, RecordDict
        from flwr.common.constant import ErrorCode

        from clients.handler import handle

        node = message.metadata.dst_node_id
        self.asked.append(node)
        if node in self.broken:
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, NO_PARTITION),
                           reply_to=message)
        if message.metadata.message_type == "query.partition":
            return Message(RecordDict({"config": ConfigRecord(
                {"partition-id": node - 100, "num-partitions": self.exp.num_clients})}),
                reply_to=message)
        return handle(self.exp, node - 100, message, self.contexts[node])

    def send_and_receive(self, messages, timeout):
        return [self._answer(m) for m in messages]

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = mid = str(uuid.uuid4())
            self.replies[mid] = self._answer(m)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(mid) for mid in message_ids if mid in self.replies]


def test_a_node_without_partition_id_is_a_failed_partition_with_its_own_error():
    """3 partitions, the node of partition 1 lacks ``partition-id``: the run goes on without
    partition 1, every update records the node's own error, and the posterior is the exact
    posterior of partitions 0 and 2 (conjugate model: PVI is exact after one update)."""
    from strategies.server_app import strategy_for

    exp = build_experiment(parse_run_config(LR))
    grid = _Grid(exp, broken={101})
    strategy = strategy_for(exp)
    logs = []
    with task_identity():
        strategy.start(grid, num_rounds=2, evaluate_fn=lambda u, _: logs.append(
            strategy.round_logs[u]))
    assert strategy.outcome == "completed" and strategy.dead == {1}
    assert grid.asked.count(101) == 1  # asked its partition once, then never again
    assert len(logs) == 2
    for log in logs:  # every exchange of the update (step, free-energy candidates) rejects it
        assert log.rejected and log.clients == (0, 2)
        for rejection in log.rejected:
            assert rejection.partition_id == 1
            assert ("partition query failed: node 101: ValueError: node config lacks "
                    "'partition-id'") in rejection.reason
    rows = np.concatenate([exp.partitions[0], exp.partitions[2]])
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train[rows],
                                   exp.dataset.y_train[rows])
    mean, cov = G.to_moments(exact)
    post = strategy.posterior
    # exact up to float64 round-off of a 4x4 solve (condition number ~1e2 here)
    np.testing.assert_allclose(post.mean(), mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(post.std() ** 2, np.diag(cov), rtol=1e-9, atol=1e-12)


def test_no_node_can_answer_the_partition_query_raises_the_clients_own_error():
    from strategies.nodes import PartitionError, partition_nodes

    exp = build_experiment(parse_run_config({**LR, "num-clients": 2}))
    with task_identity(), pytest.raises(PartitionError) as err:
        partition_nodes(_Grid(exp, broken={100, 101}), 2, timeout=5)
    message = str(err.value)
    assert "ValueError: node config lacks 'partition-id'" in message, message
    assert "no connected node serves" not in message and "\n" not in message


class _SlowGrid(_Grid):
    """A :class:`_Grid` whose ClientApps start slowly: a partition query is answered only after
    ``starts`` pulls, so a ``send_and_receive`` with a per-query timeout sees no reply (as the
    Simulation Engine's did while a loaded machine started the Ray actors); ``silent`` nodes
    never answer (a node that connected and hangs)."""

    def __init__(self, exp, starts=5, silent=(), extra=()):
        super().__init__(exp)
        self.starts, self.silent, self.pulls = starts, set(silent), 0
        from flwr.app import Context, RecordDict

        for node, pid in extra:  # more nodes (e.g. a rogue one claiming a partition)
            self.contexts[node] = Context(1, node, {"partition-id": pid}, RecordDict(), {})

    def _answer(self, message):
        if message.metadata.dst_node_id >= 900 and message.metadata.message_type == \
                "query.partition":  # an extra node claims the partition of its node config
            from flwr.app import ConfigRecord, Message, RecordDict

            node = message.metadata.dst_node_id
            self.asked.append(node)
            return Message(RecordDict({"config": ConfigRecord(
                {"partition-id": self.contexts[node].node_config["partition-id"],
                 "num-partitions": self.exp.num_clients})}), reply_to=message)
        return super()._answer(message)

    def send_and_receive(self, messages, timeout):
        for m in messages:  # pushed, but the ClientApp is not up before the query times out
            self.push_messages([m])
        return []

    def pull_messages(self, message_ids):
        self.pulls += 1
        if self.pulls < self.starts:
            return []
        silent = {mid for mid in message_ids if mid in self.replies
                  and self.replies[mid].metadata.src_node_id in self.silent}
        return [self.replies.pop(mid) for mid in message_ids
                if mid in self.replies and mid not in silent]


def test_a_slow_starting_node_is_waited_for_not_written_off(monkeypatch):
    """Issue 32: the partition query is sent once and its reply pulled for as long as
    node-timeout, so nodes whose ClientApps answer late are mapped (today's main asked each
    node once with a 120 s query timeout and never again: "0 of 2 connected")."""
    import strategies.nodes as nodes

    monkeypatch.setattr(nodes, "POLL_S", 0.01)
    exp = build_experiment(parse_run_config({**LR, "num-clients": 2}))
    with task_identity():
        assert nodes.partition_map(_SlowGrid(exp, starts=20), 2, timeout=10) == {0: 100, 1: 101}


def test_a_node_that_never_answers_fails_after_node_timeout_naming_it(monkeypatch):
    """A real hang still fails, in bounded time (node-timeout), in one line naming the node."""
    import strategies.nodes as nodes

    monkeypatch.setattr(nodes, "POLL_S", 0.01)
    exp = build_experiment(parse_run_config({**LR, "num-clients": 2}))
    started = time.monotonic()
    with task_identity(), pytest.raises(nodes.PartitionError) as err:
        nodes.partition_map(_SlowGrid(exp, starts=1, silent={101}), 2, timeout=0.5)
    took = time.monotonic() - started
    message = str(err.value)
    assert "partition ids [1] after 0 s (1 of 2 partitions connected)" in message, message
    assert "never answered the partition query: [101]" in message and "\n" not in message
    assert took < 5, took  # 0.5 s node-timeout plus one poll; 5 s bounds a loaded machine


def test_the_strategy_never_asks_nor_hears_a_node_the_run_did_not_register():
    """Issue 32: with ``deployment-nodes`` (what ``--engine deployment`` registered), a rogue
    node the SuperLink lists, here claiming partition 0, gets no message (today's main asked it
    and stopped: "nodes 100 and 999 both claim partition-id 0"), the run equals the exact
    posterior, and a reply that claims to come from it is refused."""
    from types import SimpleNamespace

    from strategies.server_app import strategy_for

    exp = build_experiment(parse_run_config({**LR, "deployment-nodes": "100,101,102"}))
    grid = _SlowGrid(exp, starts=1, extra=[(999, 0)])
    strategy = strategy_for(exp)
    with task_identity():
        strategy.start(grid, num_rounds=2, evaluate_fn=lambda u, _: None)
    assert strategy.outcome == "completed" and strategy.nodes == {0: 100, 1: 101, 2: 102}
    assert 999 not in grid.asked and set(grid.asked) == {100, 101, 102}
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train[
        np.concatenate(exp.partitions)], exp.dataset.y_train[np.concatenate(exp.partitions)])
    mean, _ = G.to_moments(exact)
    # PVI on a conjugate model is exact after one update, up to float64 round-off of a 4x4 solve
    np.testing.assert_allclose(strategy.posterior.mean(), mean, rtol=1e-9, atol=1e-12)

    def reply(src):
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=src))
    assert strategy._by_partition_of(0, reply(100)) and strategy._by_partition_of(0, reply(1))
    assert not strategy._by_partition_of(0, reply(999))  # not a node of this run
    assert not strategy._by_partition_of(0, reply(101))  # a node of the run, not partition 0's


def test_deployment_nodes_must_be_node_ids():
    from fedbayes_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match="deployment-nodes.*comma-separated node ids"):
        parse_run_config({**LR, "deployment-nodes": "1,two"})


def test_a_busy_command_may_outlast_its_base_wait_and_an_idle_one_fails():
    """The Flower tests' subprocess wait (issue 32): a CPU-bound command goes on past
    ``base_s`` (a slow start on a loaded machine); an idle one (a hang) fails once its process
    tree used under a tenth of a core over the window, with one message saying so."""
    from tests.helpers.flower_utils import run_while_busy

    busy = run_while_busy([sys.executable, "-c", "import time\nt = time.monotonic()\n"
                           "while time.monotonic() - t < 3: pass\nprint('done')"],
                          base_s=0.5, window_s=1.0)
    assert busy.returncode == 0 and busy.stdout.strip() == "done"
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"idle \(its processes used \d+% of a core over "
                                             r"the last 1 s\) after \d+ s: a hang"):
        run_while_busy([sys.executable, "-c", "import time; time.sleep(60)"], base_s=0.5,
                       window_s=1.0)
    assert time.monotonic() - started < 15  # base 0.5 s + a 1 s window; 15 s bounds a loaded CI


# ------------------------------------------------------------------ credentials, app copy (fast)
def test_certificates_and_node_keys_are_what_flower_reads(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    tls = deploy_tls.make_tls(tmp_path / "tls")
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    key = deploy_tls.make_node_key(tmp_path / "keys", "node0")
    private = serialization.load_ssh_private_key(key.private.read_bytes(), None)
    public = serialization.load_ssh_public_key(key.public.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert public.public_numbers() == private.public_key().public_numbers()
    for secret in (tls.server_key, key.private):
        assert secret.stat().st_mode & 0o077 == 0  # private keys: owner only


def test_app_copy_carries_the_full_run_config_and_plugins(tmp_path):
    config = parse_run_config({**LR, "algorithm": "empty-exchange",
                               "algorithm-modules": "benchmarks.flower.empty_exchange",
                               "output-dir": str(tmp_path / "out")}).to_run_config()
    app = flwr_cli.copy_app(tmp_path / "app", config)
    with open(app / "pyproject.toml", "rb") as f:
        meta = tomllib.load(f)
    assert meta["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "strategies.server_app:app", "clientapp": "clients.client_app:app"}
    from flwr.common.config import flatten_dict

    assert flatten_dict(meta["tool"]["flwr"]["app"]["config"]) == config
    assert (app / "benchmarks" / "flower" / "empty_exchange.py").is_file()
    assert not (app / "benchmarks" / "results").exists() and not (app / "tests").exists()


# ------------------------------------------------------------------ real processes
def _tagged(tag: str) -> list[int]:
    """Live processes carrying the test's environment tag (zombies count as gone)."""
    me = os.getpid()
    return [p for p in processes.pids()
            if p != me and processes.has_env(p, f"FEDBAYES_TEST_TAG={tag}") and processes.alive(p)]


@pytest.mark.deployment
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds PIDs in /proc")
def test_deployment_engine_equals_in_process_and_leaves_no_process(tmp_path):
    """PVI, 3 SuperNodes, TLS and SuperNode authentication, linear regression, 2 updates."""
    tag = uuid.uuid4().hex
    env = {**os.environ, "FEDBAYES_TEST_TAG": tag, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = tmp_path / "deployed"
    keys = ["--algorithm", "pvi", "--model", "linear-regression", "--dataset", "synthetic",
            "--num-clients", "3", "--partition", "iid", "--num-rounds", "2", "--seed", "0"]
    try:
        proc = subprocess.run([sys.executable, str(REPO / "run_simulation.py"), "--engine",
                               "deployment", *keys, "--output-dir", str(out), "--quiet"],
                              env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600, check=False)
    finally:
        # the CLI's watchdog outlives it by at most one poll plus its stop sequence
        deadline = time.monotonic() + processes.POLL_S + sum(g for _, g in processes.STOP_GRACE_S) + 1
        while (leftover := _tagged(tag)) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not leftover, f"processes left running:\n{describe(leftover)}"
    assert proc.returncode == 0, proc.stderr[-4000:]
    logs = out / "deployment-logs"
    listed = json.loads((logs / "processes.json").read_text())
    started, stopped = listed["started"], listed["stopped"]
    assert sorted(started) == ["superlink", "supernode-0", "supernode-1", "supernode-2"]
    # Flower's SuperExec children (own sessions) were found and stopped too
    assert set(started.values()) < set(stopped)
    assert not any(processes.alive(pid) for pid in stopped)
    superlink_log = (logs / "superlink.log").read_text()
    assert "Starting Flower SuperLink" in superlink_log
    # owner only, like the keys: the logs name ports, key paths and node ids (issue 32)
    assert logs.stat().st_mode & 0o777 == 0o700
    modes = {f.name: f.stat().st_mode & 0o777 for f in logs.iterdir()}
    assert set(modes.values()) == {0o600}, modes
    result = json.loads((out / "result.json").read_text())
    assert result["engine"] == "deployment" and result["outcome"] == "completed"
    assert [row["round"] for row in result["history"]] == [1, 2]
    assert all(row["clients"] == [0, 1, 2] for row in result["history"])

    local = tmp_path / "local"
    run_in_process(parse_run_config({**LR, "num-rounds": 2, "output-dir": str(local)}),
                   progress=False)
    with np.load(out / "posterior.npz") as a, np.load(local / "posterior.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:  # the acceptance tolerance; the same float64 maths: bitwise equal
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-12, err_msg=name)


@pytest.mark.deployment
@pytest.mark.slow
def test_deployment_resumes_a_stored_run_with_the_nodes_states(tmp_path):
    """``--resume DIR --engine deployment``: new SuperNodes (empty states) get the sequential
    PVI client-held factors back over TLS, and 3 + 1 updates equal 4 in-process updates
    (update 4 revisits partition 1, which updates 1-3 had visited)."""
    out = tmp_path / "run"
    keys = ["--algorithm", "pvi", "--model", "linear-regression", "--dataset", "synthetic",
            "--num-clients", "3", "--partition", "iid", "--seed", "0", "--run-config",
            "pvi.schedule='sequential'"]

    def cli(*argv):
        proc = subprocess.run([sys.executable, str(REPO / "run_simulation.py"), "--engine",
                               "deployment", "--quiet", *argv], cwd=tmp_path, timeout=600,
                              capture_output=True, text=True, env={**os.environ,
                                                                   "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert proc.returncode == 0, proc.stderr[-4000:]

    cli(*keys, "--num-rounds", "3", "--output-dir", str(out))
    cli("--resume", str(out), "--num-rounds", "4")
    result = json.loads((out / "result.json").read_text())
    assert result["engine"] == "deployment" and result["outcome"] == "completed"
    assert [row["clients"] for row in result["history"]] == [[0], [2], [1], [1]]
    assert result["run_config"]["resume"] == str(out)
    local = tmp_path / "local"
    run_in_process(parse_run_config({**LR, "pvi.schedule": "sequential", "num-rounds": 4,
                                     "output-dir": str(local)}), progress=False)
    with np.load(out / "posterior.npz") as a, np.load(local / "posterior.npz") as b:
        for name in a.files:  # without its factor put back, partition 1 counts its data twice
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-12, err_msg=name)


@pytest.mark.deployment
@pytest.mark.slow
def test_unregistered_supernode_exits_with_flowers_activation_error(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = flwr_cli.flwr_env(tmp_path / "flwr-home")
    procs = deploy_processes.Processes(env, log_dir)
    try:
        tls = deploy_tls.make_tls(tmp_path / "tls")
        key = deploy_tls.make_node_key(tmp_path / "keys", "stranger")  # never registered
        port = deploy_processes.free_port()
        procs.start("superlink", [
            deploy_processes.executable("flower-superlink"), "--host", "127.0.0.1", "--port", str(port),
            "--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert),
            "--ssl-keyfile", str(tls.server_key), "--enable-supernode-auth",
            "--disable-runtime-dependency-installation"])
        deploy._wait_port("127.0.0.1", port, procs, "superlink", 60)
        node = procs.start("supernode", [
            deploy_processes.executable("flower-supernode"), "--superlink", f"127.0.0.1:{port}",
            "--root-certificates", str(tls.ca_cert), "--auth-supernode-private-key",
            str(key.private), "--port", str(deploy_processes.free_port()), "--node-config",
            "partition-id=0 num-partitions=1"])
        code = node.wait(timeout=60)  # it exits at once (no retry); 60 s bounds a loaded CI
    finally:
        pids = procs.stop_all()
    assert code != 0
    text = procs.log_tail("supernode", 20000)
    assert "2004" in text and "Failed to activate SuperNode" in text, text
    assert not any(processes.alive(pid) for pid in pids)


@pytest.mark.deployment
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds PIDs in /proc")
def test_a_supernode_with_the_wrong_ca_ends_the_cli_wait_in_one_line(tmp_path):
    """Issue 32: a SuperNode given another CA certificate fails its TLS handshake; the CLI's
    own wait ends at once with one line naming the node and the TLS failure (from its log), no
    run is submitted and no process is left (its SuperExec, re-parented, included)."""
    from fedbayes_flwr.errors import DeploymentError

    wrong = deploy_tls.make_tls(tmp_path / "other-ca")
    config = parse_run_config({**LR, "num-clients": 1, "num-rounds": 1,
                               "output-dir": str(tmp_path / "out")}).to_run_config()
    started = time.monotonic()
    with pytest.raises(DeploymentError) as err:
        deploy.run_deployment(config, progress=False, node_root_certificates=wrong.ca_cert)
    took = time.monotonic() - started
    message = str(err.value)
    assert message.startswith("supernode-0 (node ") and "\n" not in message, message
    assert "over TLS: [SSL: CERTIFICATE_VERIFY_FAILED]" in message, message
    assert took < 120, took  # seconds alone; far below the 60 s x load start-up deadline
    listed = json.loads((tmp_path / "out" / "deployment-logs" / "processes.json").read_text())
    assert not any(processes.alive(pid) for pid in listed["stopped"])
    assert "serverapp.log" not in os.listdir(tmp_path / "out" / "deployment-logs")  # no run


@pytest.mark.deployment
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds PIDs in /proc")
def test_a_rogue_supernode_registered_through_the_control_api_gets_no_work(tmp_path,
                                                                           monkeypatch):
    """Issue 32: just before the run is submitted, a local process with its own FLWR_HOME, the
    run's port and CA certificate registers its own key (open-source Flower's Control API
    authenticates nobody: it answers success), starts a SuperNode claiming partition 0 and
    submits a run of its own. The ServerApp refuses the node (logged) and sends it nothing, the
    CLI stops the foreign run, and the run equals the in-process run."""
    rogue_home, rogue_logs = tmp_path / "rogue-home", tmp_path / "rogue-logs"
    rogue_logs.mkdir()
    rogue_env = flwr_cli.flwr_env(rogue_home)
    rogue_procs = deploy_processes.Processes(rogue_env, rogue_logs)
    seen: dict = {}
    real_wait = deploy._wait_online

    def wait_then_attack(node_ids, procs, env, cwd, address, deadline_s, check_stop):
        real_wait(node_ids, procs, env, cwd, address, deadline_s, check_stop)
        flwr_cli.write_connection(rogue_home, address, cwd / "tls" / "ca.crt")
        key = deploy_tls.make_node_key(tmp_path / "rogue-key", "rogue")
        reg = flwr_cli.flwr(["supernode", "register", str(key.public), flwr_cli.CONNECTION,
                             "--format", "json"], rogue_env, tmp_path)
        seen["register"] = flwr_cli.last_json(reg.stdout)
        rogue_procs.start("rogue", [
            deploy_processes.executable("flower-supernode"), "--superlink", address,
            "--root-certificates", str(cwd / "tls" / "ca.crt"), "--auth-supernode-private-key",
            str(key.private), "--port", str(deploy_processes.free_port()), "--node-config",
            "partition-id=0 num-partitions=2"])
        rogue = int(seen["register"]["node-id"])
        end = time.monotonic() + deadline_s
        while flwr_cli.node_status(rogue_env, tmp_path).get(rogue) != "online":
            assert time.monotonic() < end and not rogue_procs.exited(), \
                rogue_procs.log_tail("rogue")
            time.sleep(0.5)
        seen["online"] = True
        # ... and submits a run of its own (its ServerApp would run as the run's user)
        app = flwr_cli.copy_app(tmp_path / "rogue-app", parse_run_config(
            {**config, "num-rounds": 1, "output-dir": str(tmp_path / "rogue-out")})
            .to_run_config())
        sub = flwr_cli.flwr(["run", str(app), flwr_cli.CONNECTION, "--format", "json"],
                            rogue_env, tmp_path)
        seen["run"] = int(flwr_cli.last_json(sub.stdout)["run-id"])

    monkeypatch.setattr(deploy, "_wait_online", wait_then_attack)
    out = tmp_path / "deployed"
    config = {**LR, "num-clients": 2, "num-rounds": 2}
    try:
        deploy.run_deployment(parse_run_config({**config, "output-dir": str(out)})
                              .to_run_config(), progress=False)
    finally:
        rogue_procs.stop_all()
    assert seen["register"].get("success") and seen.get("online")  # Flower let it in
    rogue = int(seen["register"]["node-id"])
    log = (out / "deployment-logs" / "serverapp.log").read_text()
    assert f"refusing node(s) [{rogue}]: not among the nodes this run registered" in log, log
    # the foreign run was stopped within a poll of the CLI's wait
    control = (out / "deployment-logs" / "control-api.log").read_text()
    assert f"stopped run {seen['run']}: not submitted by this deployment" in control, control
    result = json.loads((out / "result.json").read_text())
    assert result["outcome"] == "completed"
    assert [row["clients"] for row in result["history"]] == [[0, 1], [0, 1]]
    local = tmp_path / "local"
    run_in_process(parse_run_config({**config, "output-dir": str(local)}), progress=False)
    with np.load(out / "posterior.npz") as a, np.load(local / "posterior.npz") as b:
        for name in a.files:  # the same float64 maths as in-process (the acceptance tolerance)
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-12, err_msg=name)


def test_a_resumed_run_takes_the_node_ids_of_its_own_deployment(tmp_path):
    """A resumed deployment registers new nodes: ``deployment-nodes`` may change on resume
    (every other key must equal the stored run's) and the new value is the one used."""
    from fedbayes_flwr.runtime.checkpoint import resumed

    out = tmp_path / "run"
    run_in_process(parse_run_config({**LR, "num-rounds": 1, "deployment-nodes": "5,6,7",
                                     "output-dir": str(out)}), progress=False)
    config, ckpt = resumed(parse_run_config({**LR, "num-rounds": 2, "resume": str(out),
                                             "deployment-nodes": "8,9,10",
                                             "output-dir": str(out)}))
    assert ckpt is not None and config.deployment_nodes == "8,9,10" and config.num_rounds == 2


def test_the_superlink_port_wait_outlasts_its_deadline_while_busy_and_not_when_idle(tmp_path):
    """Issue 32: ``_wait_port`` goes on past its deadline while the process works (a slow
    start), and an idle process that never listens (a hang) fails right after it, in one
    line."""
    from fedbayes_flwr.errors import DeploymentError

    procs = deploy_processes.Processes(dict(os.environ), tmp_path)
    port = deploy_processes.free_port()
    try:
        procs.start("busy", [sys.executable, "-c", (
            "import socket, time\nt = time.monotonic()\nwhile time.monotonic() - t < 2: pass\n"
            f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(30)")])
        deploy._wait_port("127.0.0.1", port, procs, "busy", 0.5)  # returns once listening
        procs.start("idle", [sys.executable, "-c", "import time; time.sleep(60)"])
        started = time.monotonic()
        with pytest.raises(DeploymentError, match=r"idle did not listen on 127.0.0.1:\d+ within "
                                                  r"\d+ s \(its processes used \d+% of a core"):
            deploy._wait_port("127.0.0.1", deploy_processes.free_port(), procs, "idle", 0.5)
        assert time.monotonic() - started < 15  # 0.5 s and the start-up of Python
    finally:
        procs.stop_all(grace_s=2)
