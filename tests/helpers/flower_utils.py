"""Helpers for tests that drive the ``flwr`` CLI and Flower's local SuperLink.

Everything here is keyed to a *private* ``FLWR_HOME`` (a pytest ``tmp_path``): the environment of
every Flower process a test starts carries ``FLWR_HOME=<that dir>``, so the test can find exactly
its own processes by PID (``/proc/<pid>/environ``) and stop them, never anybody else's.

Flower 1.42 facts used here (read from the installed ``flwr`` source):

* ``flwr run`` / ``flwr ls`` read connections from ``$FLWR_HOME/config.toml``; ``address =
  ":local:"`` makes the CLI start a *detached* local SuperLink (``start_new_session=True``, output
  to ``$FLWR_HOME/local-superlink/superlink.log``) unless one answers on
  ``http://127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT/health`` (default 39091). The PID is not
  recorded anywhere, so :func:`local_superlink_pids` finds it in ``/proc``.
* In 1.42 the SuperLink serves all its APIs over one HTTP port, so choosing that port (and the
  deprecated control port) via the environment isolates a test from other SuperLinks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedbayes_flwr.deploy import watchdog as processes

REPO = Path(__file__).resolve().parents[2]
APP_ITEMS = ("pyproject.toml", "README.md", "fedbayes_flwr", "strategies", "clients")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flwr_env(flwr_home: Path, superlink_port: int, control_port: int) -> dict[str, str]:
    """Environment for ``flwr`` commands: private home, own ports, offline and quiet."""
    env = os.environ.copy()
    bin_dir = str(Path(sys.executable).parent)  # flwr, flower-superlink, flwr-serverapp ...
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(superlink_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
        "NO_COLOR": "1",
        "COLUMNS": "200",
    })
    return env


def write_local_simulation_config(flwr_home: Path, num_supernodes: int,
                                  num_cpus: int = 1) -> Path:
    """``$FLWR_HOME/config.toml`` with one default connection ``local`` (managed SuperLink).

    ``options.*`` is the SuperLink connection's simulation configuration (1.42 still honours it,
    with a deprecation notice pointing at ``--federation-config``).
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        "[superlink]\n"
        'default = "local"\n'
        "\n"
        "[superlink.local]\n"
        'address = ":local:"\n'
        f"options.num-supernodes = {num_supernodes}\n"
        f"options.backend.client-resources.num-cpus = {num_cpus}\n"
        "options.backend.client-resources.num-gpus = 0.0\n",
        encoding="utf-8",
    )
    return path


def copy_app(dest: Path) -> Path:
    """Copy the Flower app (sources and pyproject only) to ``dest`` and return it."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in APP_ITEMS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float,
            log: Path | None = None) -> subprocess.CompletedProcess:
    """Run a CLI command; stdout and stderr together; appended to ``log`` when given."""
    proc = subprocess.run(args, env=env, cwd=cwd, timeout=timeout, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, check=False)
    if log is not None:
        with log.open("a", encoding="utf-8") as f:
            f.write(f"$ {' '.join(args)}  (rc={proc.returncode})\n{proc.stdout}\n")
    return proc


def started_run_id(output: str) -> int:
    """The run id from ``flwr run`` output (``Successfully started run <id>``)."""
    match = re.search(r"Successfully started run (\d+)", output)
    if match is None:
        raise AssertionError(f"`flwr run` did not start a run:\n{output}")
    return int(match.group(1))


def last_json_object(output: str) -> dict:
    """The last top-level JSON object printed in ``output`` (rich may pretty-print it)."""
    decoder = json.JSONDecoder()
    found = None
    for start in (m.start() for m in re.finditer(r"^\{", output, flags=re.MULTILINE)):
        try:
            found, _ = decoder.raw_decode(output[start:])
        except json.JSONDecodeError:
            continue
    if found is None:
        raise AssertionError(f"no JSON object in output:\n{output}")
    return found


def run_status(run_id: int, env: dict[str, str], cwd: Path, timeout: float = 30.0,
               log: Path | None = None) -> dict:
    """``flwr ls --run-id ID --format json`` -> that run's entry (``status`` etc.)."""
    proc = run_cli(["flwr", "ls", "--run-id", str(run_id), "--format", "json"], env, cwd,
                   timeout, log)
    payload = last_json_object(proc.stdout)
    assert proc.returncode == 0 and payload.get("success"), proc.stdout
    (entry,) = [r for r in payload["runs"] if int(r["run-id"]) == run_id]
    return entry


def wait_finished(run_id: int, env: dict[str, str], cwd: Path, deadline_s: float,
                  log: Path | None = None) -> dict:
    """Poll the run's status until it is ``finished:*`` (or the deadline passes)."""
    end = time.monotonic() + deadline_s
    while True:
        entry = run_status(run_id, env, cwd, log=log)
        if entry["status"].startswith("finished") or time.monotonic() > end:
            return entry
        time.sleep(0.5)


# --- processes -----------------------------------------------------------------------------
tree_cpu_s = processes.tree_cpu_seconds  # CPU seconds of a process and its descendants


def run_while_busy(argv: list[str], *, base_s: float = 400.0, cap_s: float = 3600.0,
                   window_s: float = 30.0, busy_cores: float = 0.1,
                   **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, **kwargs)`` with a wait that is
    robust to a loaded machine and still catches a hang.

    The command may run past ``base_s`` as long as its process tree keeps working: its deadline
    moves on while the tree used at least ``busy_cores`` of one core over the last
    ``window_s`` (start-up on a loaded machine is CPU-bound: Ray actors and ClientApps importing
    TensorFlow, tracing; one CPU-bound process still gets ~0.2 of a core at load 9 on 2 cores,
    an idle Ray cluster used 0.03 here). A hang (every process waiting: a node that never connects, a reply
    that never comes) uses almost no CPU, so the command is stopped (its whole session) and
    ``AssertionError`` names the elapsed time and the CPU share, after at most
    ``base_s + window_s``; ``cap_s`` bounds everything.
    """
    import tempfile

    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)
        samples = [(start, 0.0)]  # (time, tree CPU seconds)
        why = None
        while proc.poll() is None:
            time.sleep(min(1.0, window_s / 4))
            now = time.monotonic()
            samples.append((now, max(samples[-1][1], tree_cpu_s(proc.pid))))
            while len(samples) > 2 and samples[1][0] <= now - window_s:
                samples.pop(0)
            (t0, c0), (t1, c1) = samples[0], samples[-1]
            share = (c1 - c0) / max(t1 - t0, 1e-9)
            if now - start > cap_s:
                why = f"still running after the cap of {cap_s:.0f} s"
            elif now - start > base_s and t1 - t0 >= window_s * 0.9 and share < busy_cores:
                why = (f"idle (its processes used {share:.0%} of a core over the last "
                       f"{window_s:.0f} s) after {now - start:.0f} s: a hang")
            if why:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
    if why:
        raise AssertionError(f"{' '.join(map(str, argv))[:200]}: {why}; stderr tail: "
                             f"{done.stderr[-2000:]}")
    return done




def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of ``flower-superlink`` processes started for ``flwr_home`` (by ``flwr`` or us)."""
    log_file = str(flwr_home / "local-superlink" / "superlink.log")
    out = []
    for pid in processes.pids():
        argv = _cmdline(pid)
        if any(a.endswith("flower-superlink") for a in argv) and log_file in argv:
            out.append(pid)
    return out


def processes_of(flwr_home: Path) -> list[int]:
    """PIDs of live processes (other than this one) whose environment has this FLWR_HOME."""
    me = os.getpid()
    return [pid for pid in processes.pids() if pid != me
            and processes.has_env(pid, f"FLWR_HOME={flwr_home}") and processes.alive(pid)]


def describe(pids: list[int]) -> str:
    return "\n".join(f"{pid}: {' '.join(_cmdline(pid))[:200]}" for pid in pids)


def stop_pids(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM each PID (and its process group when it leads one), SIGKILL what outlives
    ``grace_s``; return the PIDs that were still alive after SIGKILL."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid:  # detached SuperLink: own session and group
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(processes.alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if processes.alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    time.sleep(0.2)
    return [p for p in pids if processes.alive(p)]


def stop_flower(flwr_home: Path) -> list[int]:
    """Stop the local SuperLink of ``flwr_home`` by PID, then anything else that carries this
    FLWR_HOME (ServerApp / simulation / Ray processes). Returns the PIDs stopped."""
    stopped = local_superlink_pids(flwr_home)
    stop_pids(stopped)
    rest = processes_of(flwr_home)
    stop_pids(rest)
    return stopped + rest


@contextlib.contextmanager
def task_identity(run_id: int = 1, node_id: int = 1, task_id: int = 1):
    """Let a test build Flower ``Message`` objects outside a Flower process (Flower stamps them
    with the current task's identity); the previous identity is restored afterwards."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


# --- an in-process Grid ----------------------------------------------------------------------
NODE_ID_OFFSET = 100  # node ID = NODE_ID_OFFSET + partition ID


class LoopbackGrid:
    """A Flower Grid in this process, for driving the generic strategy without a SuperLink.

    Every pushed message is answered at once by the real client handler
    (:func:`clients.handler.handle`) on its node's own ``Context``; a fresh instance is a new
    run (every node's ``context.state`` is empty, as Flower leaves it). The partition query
    (pushed, or through ``send_and_receive``) is answered from the partition IDs.

    A handler that raises becomes what Flower's link returns: an error reply
    (``CLIENT_APP_RAISED_EXCEPTION``) for a ``ValueError`` (e.g. a refused client-state
    version) or an injected fault; an injected ``hang`` never answers (a test patches the
    handler's sleep away): once the message's ttl has passed, a pull returns Flower's
    MESSAGE_UNAVAILABLE error from the SuperLink node.

    Attributes
    ----------
    contexts : dict
        Node ID -> that node's ``Context`` (a test may wipe ``.state``: a SuperNode restart).
    pushed : list
        ``(partition, message)`` for every pushed message, in order.
    actions : list
        ``(partition, action)`` for every pushed message, in order (the envelope's action).
    """

    def __init__(self, exp):
        from flwr.app import Context, RecordDict

        self.exp = exp
        self.contexts = {NODE_ID_OFFSET + p: Context(1, NODE_ID_OFFSET + p, {"partition-id": p},
                                                     RecordDict(), {})
                         for p in range(exp.num_clients)}
        self.pushed: list = []
        self.actions: list = []
        self.replies: dict = {}  # message id -> reply Message, or None while hung
        self.sent: dict = {}  # message id -> the pushed Message

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout):  # the partition query
        from flwr.app import ConfigRecord, Message, RecordDict

        return [Message(RecordDict({"config": ConfigRecord(
            {"partition-id": m.metadata.dst_node_id - NODE_ID_OFFSET,
             "num-partitions": self.exp.num_clients})}), reply_to=m) for m in messages]

    def push_messages(self, messages):
        import uuid

        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode

        from clients.handler import handle
        from fedbayes_flwr import codec
        from fedbayes_flwr.runtime.faults import InjectedFault

        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = mid = str(uuid.uuid4())
            if m.metadata.message_type == "query.partition":
                self.sent[mid] = m
                (self.replies[mid],) = self.send_and_receive([m], 0.0)
                ids.append(mid)
                continue
            node = m.metadata.dst_node_id
            partition = node - NODE_ID_OFFSET
            self.pushed.append((partition, m))
            self.actions.append((partition, str(codec.config_of(m.content)["action"])))
            self.sent[mid] = m
            try:
                self.replies[mid] = handle(self.exp, partition, m, self.contexts[node])
            except (InjectedFault, ValueError) as err:  # the ClientApp raised
                hung = isinstance(err, InjectedFault) and err.kind == "hang"
                self.replies[mid] = None if hung else Message(
                    Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, str(err)), reply_to=m)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        out = []
        for mid in message_ids:
            reply = self.replies.get(mid)
            meta = self.sent[mid].metadata
            if reply is not None:
                out.append(reply)
                del self.replies[mid]
            elif mid in self.replies and time.time() > meta.created_at + meta.ttl:
                from flwr.server.superlink.linkstate.utils import (
                    create_message_error_unavailable_ins_message,
                )

                out.append(create_message_error_unavailable_ins_message(mid, meta.run_id))
                del self.replies[mid]
        return out
