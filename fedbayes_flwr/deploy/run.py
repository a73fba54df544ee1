"""A Flower deployment on this machine, with TLS and SuperNode authentication, in one call.

``run_simulation.py --engine deployment`` calls :func:`run_deployment`. It drives Flower's own
commands as subprocesses (this package never imports ``flwr``), in this order:

1. a private temporary directory (mode 0700) holding a CA, a server certificate for 127.0.0.1,
   one SuperNode key pair per partition, a private ``FLWR_HOME`` (the user's Flower config is
   never touched), a copy of the app whose ``[tool.flwr.app.config]`` is this run's full run
   config, and the nodes' partition cache;
2. ``flower-superlink`` with TLS, ``--enable-supernode-auth`` and
   ``--disable-runtime-dependency-installation`` (the SuperLink installs by default);
3. ``flwr supernode register`` for every public key, BEFORE its SuperNode starts (an
   unregistered SuperNode exits at once with "[code: 2004] Failed to activate SuperNode" and
   does not retry);
4. one ``flower-supernode`` per partition: its own ``--port``, its private key, the CA, and node
   config ``partition-id=K num-partitions=M cache-dir=...``;
5. ``flwr run`` on the TLS connection, then ``flwr ls --run-id`` until the run is
   ``finished:*`` (``flwr run`` exits 0 even when the ServerApp fails);
6. every process it started is stopped by process group (each runs in its own session), on
   success, on error, on Ctrl-C and on SIGTERM; the temporary directory is removed.

The ServerApp writes the usual result files to ``output-dir`` (the SuperLink host is this
machine); each process's log goes to ``<output-dir>/deployment-logs/``.

References
----------
../shared/FLOWER_NOTES.md, "Deployment with TLS and node authentication" (the verified flwr 1.42
sequence); Flower documentation, "Enable TLS connections" and "Authenticate SuperNodes".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from fedbayes_flwr.deploy.flwr_cli import (
    CONNECTION,
    STARTUP_TIMEOUT_S,
    copy_app,
    flwr,
    flwr_env,
    last_json,
    list_runs,
    node_status,
    one_line,
    register_keys,
    tls_failure,
    toml_value,
    write_connection,
)
from fedbayes_flwr.deploy.processes import Processes, executable, free_port, sigterm_raises
from fedbayes_flwr.deploy.tls import make_node_key, make_tls, write_private
from fedbayes_flwr.deploy.watchdog import tree_cpu_seconds
from fedbayes_flwr.errors import DeploymentError
from fedbayes_flwr.runtime.steps import Interrupted, check_stop

LOG_DIR = "deployment-logs"  # under output-dir
POLL_S = 2.0


# ----------------------------------------------------------------------------- credentials


# ----------------------------------------------------------------------------- processes


# ----------------------------------------------------------------------------- flwr CLI


# ----------------------------------------------------------------------------- the app copy


# ----------------------------------------------------------------------------- the run


class Deployment(NamedTuple):
    """What :func:`run_deployment` did: the run id, its final ``flwr ls`` entry, the PIDs it
    started (all stopped) and where the process logs are."""

    run_id: int | None
    status: dict
    pids: list[int]
    log_dir: Path


BUSY_WINDOW_S = 10.0  # a start-up that used this share of a core over this window is working
BUSY_SHARE = 0.05  # a CPU-bound process gets ~0.2 of a core at load 9 on 2 cores; a hung one ~0
WAIT_CAP_S = 600.0  # no start-up wait lasts longer, however busy


class _Busy:
    """The CPU share of some processes (and their descendants) over the last
    :data:`BUSY_WINDOW_S` seconds, sampled on each call."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.samples = [(time.monotonic(), self._cpu())]

    def _cpu(self) -> float:
        return sum(tree_cpu_seconds(pid) for pid in self.pids)

    def share(self) -> tuple[float, float]:
        """``(share of one core, seconds it covers)`` now."""
        now = time.monotonic()
        self.samples.append((now, self._cpu()))
        while len(self.samples) > 2 and self.samples[1][0] <= now - BUSY_WINDOW_S:
            self.samples.pop(0)
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return max(0.0, c1 - c0) / max(t1 - t0, 1e-9), t1 - t0


def _wait_port(host: str, port: int, procs: Processes, name: str, deadline_s: float) -> None:
    """Wait until ``name`` listens on ``host:port``: up to ``deadline_s``, and on past it while
    its processes still work (at least :data:`BUSY_SHARE` of a core over the last
    :data:`BUSY_WINDOW_S`: a loaded machine starts everything slower), at most
    :data:`WAIT_CAP_S`. An idle process that does not listen (a hang) or one that exits ends
    the wait with one line."""
    start = time.monotonic()
    busy = _Busy([procs.started[name].pid])
    while True:
        if name in procs.exited():
            raise DeploymentError(f"{name} exited with status {procs.exited()[name]}: "
                                  f"{one_line(procs.log_tail(name))}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
        share, window = busy.share()
        took = time.monotonic() - start
        if took > deadline_s and (share < BUSY_SHARE or took > WAIT_CAP_S):
            raise DeploymentError(f"{name} did not listen on {host}:{port} within "
                                  f"{took:.0f} s (its processes used {share:.0%} of a "
                                  f"core over the last {window:.0f} s); log "
                                  f"{procs.log_dir / (name + '.log')}")


def _wait_online(node_ids: list[int], procs: Processes, env, cwd: Path, address: str,
                 deadline_s: float, check_stop) -> None:
    """Wait until every SuperNode ``supernode-K`` (node id ``node_ids[K]``) is online.

    Fails at once, in one line naming the node, when its process exits or its log shows a TLS
    failure (Flower's SuperNode reports it and ends, or retries, however ``--max-retries`` is
    set), and after ``deadline_s`` for nodes that stay offline, unless their processes still
    work (:class:`_Busy`, at most :data:`WAIT_CAP_S`).
    """
    start = time.monotonic()
    names = {node: f"supernode-{k}" for k, node in enumerate(node_ids)}
    busy = _Busy([procs.started[name].pid for name in names.values()])
    while True:
        check_stop()
        procs.note()
        for node, name in names.items():
            tail = procs.log_tail(name, 20000)
            failure = tls_failure(tail)
            if failure is not None:
                raise DeploymentError(
                    f"{name} (node {node}) could not connect to the SuperLink {address} over "
                    f"TLS: {failure} (is its --root-certificates the CA that signed the "
                    f"SuperLink's certificate?); log {procs.log_dir / (name + '.log')}")
            if name in procs.exited():
                raise DeploymentError(f"{name} (node {node}) exited with status "
                                      f"{procs.exited()[name]} before it was online: "
                                      f"{one_line(tail)}")
        status = node_status(env, cwd)
        offline = {names[n]: status.get(n, "unknown") for n in node_ids
                   if status.get(n) != "online"}
        if not offline:
            return
        share, window = busy.share()
        took = time.monotonic() - start
        if took > deadline_s and (share < BUSY_SHARE or took > WAIT_CAP_S):
            states = ", ".join(f"{name} {state}" for name, state in offline.items())
            raise DeploymentError(f"SuperNodes not online after {took:.0f} s ({states}; their "
                                  f"processes used {share:.0%} of a core over the last "
                                  f"{window:.0f} s); logs in {procs.log_dir}")
        time.sleep(0.5)


def _mark_interrupted(output_dir: Path) -> None:
    """A stopped deployment cannot reach its ServerApp's recorder: mark ``result.json``."""
    path = output_dir / "result.json"
    with contextlib.suppress(OSError, ValueError):
        result = json.loads(path.read_text())
        if result.get("outcome") == "running":
            result["outcome"] = "interrupted"
            path.write_text(json.dumps(result, indent=2))


def run_deployment(run_config: dict, *, progress: bool = True, host: str = "127.0.0.1",
                   run_timeout_s: float | None = None, node_config: dict | None = None,
                   keep_dir: Path | None = None, partition_cache: bool = True,
                   node_root_certificates: Path | None = None) -> Deployment:
    """Run the experiment of ``run_config`` (a full kebab-case run config with an absolute
    ``output-dir``) on a TLS + SuperNode-authentication deployment on this machine.

    Raises :class:`DeploymentError` (one line) when the deployment cannot start or the run does
    not finish ``completed``; :class:`fedbayes_flwr.runtime.steps.Interrupted` after a Ctrl-C (the
    finished updates stay in ``output-dir``). Every process started is stopped before it
    returns or raises. ``node_config`` adds keys to every SuperNode's node config;
    ``keep_dir`` keeps a copy of the private directory there (for debugging; it holds keys);
    ``partition_cache=False`` leaves ``cache-dir`` out of the node config (every message then
    loads and splits the data again: the benchmark's "before"); ``node_root_certificates``
    gives the SuperNodes another CA certificate than the run's (a test of the TLS failure).

    The SuperNodes must all be online before the run is submitted, within ``max(STARTUP_TIMEOUT_S,
    30 x the SuperLink's own start-up time)`` (a loaded machine starts every process slower), or
    later while their processes still work; a SuperNode that exits or fails its TLS handshake ends
    the wait at once with one line naming it. The run config given to the apps carries ``deployment-
    nodes``, the node ids registered here: the ServerApp sends work to no other node and refuses any
    other node's reply (a node registered by someone else through the Control API gets nothing).
    """

    output_dir = Path(str(run_config["output-dir"]))
    num_clients = int(run_config["num-clients"])
    log_dir = output_dir / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    log_dir.chmod(0o700)  # the logs name the run's ports, keys' paths, node ids: owner only
    earlier = list(log_dir.glob("*.log"))
    if not run_config.get("resume"):  # a resumed run's result.json holds the rows it continues
        earlier.append(output_dir / "result.json")
    for old in earlier:
        old.unlink(missing_ok=True)  # an earlier run's (the ServerApp's recorder does the same)
    work = Path(tempfile.mkdtemp(prefix="fedbayes-deploy-"))  # mode 0700
    flwr_home, app_dir = work / "flwr-home", work / "app"
    env = flwr_env(flwr_home)
    procs = Processes(env, log_dir)
    run_id, status = None, {}
    say = (lambda text: print(f"deployment: {text}", file=sys.stderr, flush=True)) if progress \
        else (lambda text: None)
    try:
        with sigterm_raises():
            tls = make_tls(work / "tls", host)
            keys = [make_node_key(work / "keys", f"supernode-{k}") for k in range(num_clients)]
            port = free_port(host)
            procs.start("superlink", [
                executable("flower-superlink"), "--host", host, "--port", str(port),
                "--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert),
                "--ssl-keyfile", str(tls.server_key), "--enable-supernode-auth",
                "--disable-runtime-dependency-installation"])
            write_connection(flwr_home, f"{host}:{port}", tls.ca_cert)
            started = time.monotonic()
            _wait_port(host, port, procs, "superlink", STARTUP_TIMEOUT_S)
            startup_s = time.monotonic() - started
            node_ids = register_keys(keys, env, work)
            copy_app(app_dir, {**run_config,
                               "deployment-nodes": ",".join(map(str, node_ids))})
            extra = " ".join(f"{k}={toml_value(v)}" for k, v in (node_config or {}).items())
            for k, key in enumerate(keys):
                config = f"partition-id={k} num-partitions={num_clients} {extra}"
                if partition_cache:
                    config += f" cache-dir={toml_value(str(work / 'cache' / str(k)))}"
                procs.start(f"supernode-{k}", [
                    executable("flower-supernode"), "--superlink", f"{host}:{port}",
                    "--root-certificates", str(node_root_certificates or tls.ca_cert),
                    "--auth-supernode-private-key",
                    str(key.private), "--port", str(free_port(host)), "--node-config",
                    config.strip()])
            say(f"SuperLink {host}:{port} (TLS, SuperNode authentication), {num_clients} "
                f"SuperNodes; logs in {log_dir}")
            _wait_online(node_ids, procs, env, work, f"{host}:{port}",
                         max(STARTUP_TIMEOUT_S, 30 * startup_s), check_stop)
            say(f"{num_clients} SuperNodes online (node ids {', '.join(map(str, node_ids))})")
            proc = flwr(["run", str(app_dir), CONNECTION, "--format", "json"], env, work)
            payload = last_json(proc.stdout)
            if not payload.get("success") or "run-id" not in payload:
                raise DeploymentError(f"flwr run failed: {one_line(proc.stdout)}")
            run_id = int(payload["run-id"])
            say(f"run {run_id} submitted")
            status = _wait_run(run_id, env, work, procs, output_dir, run_timeout_s, say,
                               check_stop)
    except Interrupted:
        if run_id is not None:
            with contextlib.suppress(Exception):
                flwr(["stop", str(run_id), CONNECTION], env, work, timeout=20)
        _mark_interrupted(output_dir)
        raise
    finally:
        if run_id is not None:
            with contextlib.suppress(Exception):
                logs = flwr(["log", str(run_id), CONNECTION, "--show"], env, work, timeout=30)
                write_private(log_dir / "serverapp.log",
                              re.sub(r"\x1b\[[0-9;]*m", "", logs.stdout).encode())
        pids = procs.stop_all()
        write_private(log_dir / "processes.json", json.dumps(
            {"started": {name: p.pid for name, p in procs.started.items()},
             "stopped": pids}, indent=2).encode())
        if keep_dir is not None:
            shutil.copytree(work, keep_dir, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    deployment = Deployment(run_id, status, pids, log_dir)
    if status.get("status") != "finished:completed":
        details = status.get("status-details") or "see " + str(log_dir / "serverapp.log")
        raise DeploymentError(f"run {run_id} ended {status.get('status', 'unknown')}: {details}")
    return deployment


def _wait_run(run_id: int, env, cwd: Path, procs: Processes, output_dir: Path,
              timeout_s: float | None, say, check_stop) -> dict:
    """Poll ``flwr ls`` until the run is ``finished:*``; fail at once when a SuperNode or the
    SuperLink exits; report each newly recorded update.

    Any other run on the SuperLink was submitted by someone else through the Control API
    (open-source Flower authenticates no user): it is stopped (``flwr stop``) within a poll and
    named on the console, since its ServerApp runs as this user and could message this run's
    SuperNodes."""
    start, seen, status = time.monotonic(), 0, {}
    stopped: set[int] = set()
    while True:
        check_stop()
        procs.note()
        dead = procs.exited()
        if dead:
            name, code = sorted(dead.items())[0]
            raise DeploymentError(f"{name} exited with status {code} during run {run_id}: "
                                  f"{one_line(procs.log_tail(name))}")
        runs = list_runs(env, cwd)
        status = runs.get(run_id, status)
        for foreign in sorted(set(runs) - {run_id} - stopped):
            stopped.add(foreign)
            if not str(runs[foreign].get("status", "")).startswith("finished"):
                with contextlib.suppress(Exception):
                    flwr(["stop", str(foreign), CONNECTION], env, cwd, timeout=30)
            line = (f"stopped run {foreign}: not submitted by this deployment (another process "
                    f"reached the SuperLink's Control API)")
            say(line)
            fd = os.open(procs.log_dir / "control-api.log",
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line + "\n")
        rows = _recorded_rows(output_dir)
        if rows > seen:
            say(f"run {run_id}: update {rows} recorded")
            seen = rows
        if str(status.get("status", "")).startswith("finished"):
            return status
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise DeploymentError(f"run {run_id} did not finish within {timeout_s:.0f} s "
                                  f"(status {status.get('status', 'unknown')})")
        time.sleep(POLL_S)


def _recorded_rows(output_dir: Path) -> int:
    try:
        return len(json.loads((output_dir / "result.json").read_text()).get("history", []))
    except (OSError, ValueError):
        return 0
