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
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

from fedbayes_flwr.deploy.watchdog import alive, descendants

CONNECTION = "fedbayes-deployment"  # the SuperLink connection name in the private FLWR_HOME
LOG_DIR = "deployment-logs"  # under output-dir
APP_PACKAGES = ("fedbayes_flwr", "strategies", "clients")
ROOT = Path(__file__).resolve().parents[2]  # the app's root (pyproject.toml)
STARTUP_TIMEOUT_S = 60.0
POLL_S = 2.0
CLI_TIMEOUT_S = 120.0


class DeploymentError(RuntimeError):
    """The deployment could not start or its run did not complete; one line saying why."""


class TLSFiles(NamedTuple):
    ca_cert: Path
    server_cert: Path
    server_key: Path


class NodeKey(NamedTuple):
    private: Path
    public: Path


# ----------------------------------------------------------------------------- credentials


def _write_private(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _have_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def make_tls(directory: Path, host: str = "127.0.0.1", days: int = 2) -> TLSFiles:
    """A CA and a server certificate for ``host`` (its subjectAltName), ECDSA P-256, valid for
    ``days``: with the ``cryptography`` package when installed (Flower depends on it), else with
    the ``openssl`` command."""
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    if _have_cryptography():
        _tls_cryptography(files, host, days)
    else:
        _tls_openssl(files, host, days)
    return files


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _tls_cryptography(files: TLSFiles, host: str, days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedbayes-flwr local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([_san(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca.public_bytes(pem))
    files.server_cert.write_bytes(cert.public_bytes(pem))
    _write_private(files.server_key, key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _run_tool(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DeploymentError(f"{argv[0]} failed ({proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-500:]}")


def _tls_openssl(files: TLSFiles, host: str, days: int) -> None:
    if shutil.which("openssl") is None:
        raise DeploymentError("making certificates needs the 'cryptography' package or the "
                              "'openssl' command; neither is available")
    d = files.ca_cert.parent
    ec_args = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    kind = "IP" if _is_ip(host) else "DNS"
    (d / "san.cnf").write_text(f"subjectAltName={kind}:{host}\n")
    old = os.umask(0o077)
    try:
        _run_tool(["openssl", "req", "-x509", *ec_args, "-days", str(days), "-subj",
                   "/CN=fedbayes-flwr local CA", "-keyout", "ca.key", "-out", "ca.crt"], d)
        _run_tool(["openssl", "req", *ec_args, "-subj", f"/CN={host}", "-keyout", "server.key",
                   "-out", "server.csr"], d)
        _run_tool(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey",
                   "ca.key", "-CAcreateserial", "-days", str(days), "-extfile", "san.cnf",
                   "-out", "server.crt"], d)
    finally:
        os.umask(old)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def make_node_key(directory: Path, name: str) -> NodeKey:
    """An ECDSA P-384 key pair in OpenSSH format (what ``flower-supernode
    --auth-supernode-private-key`` and ``flwr supernode register`` read)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = NodeKey(directory / name, directory / f"{name}.pub")
    if _have_cryptography():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        private = ec.generate_private_key(ec.SECP384R1())
        _write_private(key.private, private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption()))
        key.public.write_bytes(private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    else:
        _run_tool(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", name],
                  directory)
    return key


# ----------------------------------------------------------------------------- processes


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def executable(name: str) -> str:
    """``name`` next to this Python (the virtual environment's ``bin``), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"{name!r} not found next to {sys.executable} nor on PATH "
                              f"(install flwr in this environment)")
    return found


def _die_with_parent() -> None:  # pragma: no cover  (runs in the child before exec)
    """Linux: the child gets SIGTERM when this process dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Processes:
    """Background processes, each in its own session (a Ctrl-C in the terminal reaches only this
    process, which then stops them in order), stopped by process group."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env, self.log_dir = env, log_dir
        self.started: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        self.started[name] = proc
        return proc

    def log_tail(self, name: str, chars: int = 1500) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return re.sub(r"\x1b\[[0-9;]*m", "", text)[-chars:]

    def exited(self) -> dict[str, int]:
        """``{name: returncode}`` of the processes that have ended."""
        return {n: p.returncode for n, p in self.started.items() if p.poll() is not None}

    def stop_all(self, grace_s: float = 10.0) -> list[int]:
        """SIGTERM every started process and its descendants, each by process group (Flower
        starts its SuperExec in a new session, and that starts the ServerApp / ClientApp
        processes), SuperNodes first, the SuperLink last; SIGKILL what outlives ``grace_s``.
        Returns every PID seen."""
        procs = list(self.started.values())[::-1]
        pids = [pid for proc in procs for pid in (proc.pid, *sorted(descendants(proc.pid)))]
        mine = os.getpgrp()
        groups = list(dict.fromkeys(g for g in map(_pgid, pids) if g not in (None, mine)))
        for group in groups:
            _signal_group(group, signal.SIGTERM)
        end = time.monotonic() + grace_s
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
        while time.monotonic() < end and any(alive(pid) for pid in pids):
            time.sleep(0.1)
        for group in groups:
            _signal_group(group, signal.SIGKILL)
        for pid in pids:  # a descendant that left its group
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return pids


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM becomes ``SystemExit(143)`` in the block, so ``finally`` clauses stop the
    processes (a plain SIGTERM would end this process and orphan them)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------- flwr CLI


def flwr_env(flwr_home: Path) -> dict[str, str]:
    """This process's environment with a private FLWR_HOME, offline and quiet."""
    env = os.environ.copy()
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
    })
    env.pop("RAY_ADDRESS", None)
    return env


def flwr(args: list[str], env: dict[str, str], cwd: Path,
         timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``flwr ARGS`` (stdout and stderr together)."""
    return subprocess.run([executable("flwr"), *args], env=env, cwd=cwd, timeout=timeout,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, check=False)


def last_json(output: str) -> dict:
    """The last top-level JSON object in ``output`` (``{}`` when there is none)."""
    decoder, found = json.JSONDecoder(), {}
    for match in re.finditer(r"^\{", output, flags=re.MULTILINE):
        with contextlib.suppress(json.JSONDecodeError):
            found, _ = decoder.raw_decode(output[match.start():])
    return found


def write_connection(flwr_home: Path, address: str, ca_cert: Path,
                     name: str = CONNECTION) -> Path:
    """``$FLWR_HOME/config.toml`` with one TLS SuperLink connection, the default
    (``root-certificates`` must be an absolute path)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n'
                    f'address = "{address}"\nroot-certificates = "{ca_cert.resolve()}"\n',
                    encoding="utf-8")
    return path


def register_keys(keys: list[NodeKey], env: dict[str, str], cwd: Path,
                  deadline_s: float = STARTUP_TIMEOUT_S) -> None:
    """``flwr supernode register`` every public key (in parallel), retrying while the SuperLink
    is still starting; raise :class:`DeploymentError` with Flower's answer otherwise."""
    pending, end = list(keys), time.monotonic() + deadline_s
    while pending:
        procs = [(key, subprocess.Popen(
            [executable("flwr"), "supernode", "register", str(key.public), CONNECTION,
             "--format", "json"], env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)) for key in pending]
        failed = []
        for key, proc in procs:
            out, _ = proc.communicate(timeout=CLI_TIMEOUT_S)
            if not last_json(out).get("success"):
                failed.append((key, out))
        if failed and time.monotonic() > end:
            key, out = failed[0]
            raise DeploymentError(f"flwr supernode register {key.public.name} failed: "
                                  f"{_one_line(out)}")
        pending = [key for key, _ in failed]
        if pending:
            time.sleep(1.0)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if ln.strip()]
    return lines[-1][:400] if lines else "(no output)"


def run_status(run_id: int, env: dict[str, str], cwd: Path) -> dict:
    """``flwr ls --run-id`` -> the run's entry (``status``, ``status-details`` ...), ``{}`` when
    the SuperLink does not answer."""
    payload = last_json(flwr(["ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
                             env, cwd).stdout)
    runs = [r for r in payload.get("runs", []) if int(r.get("run-id", -1)) == run_id]
    return runs[0] if runs else {}


# ----------------------------------------------------------------------------- the app copy


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if value == value else "nan"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    raise DeploymentError(f"run-config value {value!r} ({type(value).__name__}) is not a "
                          f"TOML scalar")


def app_pyproject(run_config: dict, source: Path = ROOT / "pyproject.toml") -> str:
    """The app's ``pyproject.toml`` with ``[tool.flwr.app.config]`` replaced by ``run_config``
    (every key, sections as dotted keys): ``flwr run`` then needs no ``--run-config``, and a
    plugin's section keys, absent from the repository's pyproject, reach the apps too."""
    with open(source, "rb") as f:
        meta = tomllib.load(f)
    project, app = meta["project"], meta["tool"]["flwr"]["app"]
    lines = ["[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"',
             "", "[project]"]
    for key in ("name", "version", "description"):
        lines.append(f"{key} = {_toml_value(project[key])}")
    lines.append("dependencies = [" + ", ".join(_toml_value(d) for d in
                                                project.get("dependencies", [])) + "]")
    lines += ["", "[tool.hatch.build.targets.wheel]",
              f"packages = [{', '.join(_toml_value(p) for p in APP_PACKAGES)}]",
              "", "[tool.flwr.app]", f"publisher = {_toml_value(app['publisher'])}",
              "", "[tool.flwr.app.components]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in app["components"].items()]
    lines += ["", "[tool.flwr.app.config]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in run_config.items()]
    return "\n".join(lines) + "\n"


def copy_app(dest: Path, run_config: dict) -> Path:
    """The app's packages (``.py`` files), the top-level package of each plugin module in
    ``algorithm-modules`` that lives in this repository, and :func:`app_pyproject`."""
    dest.mkdir(parents=True, exist_ok=True)
    names = set(APP_PACKAGES)
    for module in str(run_config.get("algorithm-modules", "")).split(","):
        top = module.strip().split(".")[0]
        if top and ((ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file()):
            names.add(top)

    def ignore(directory, entries):
        return [e for e in entries if e in ("__pycache__", "results")
                or (os.path.isfile(os.path.join(directory, e)) and not e.endswith(".py"))]

    for name in sorted(names):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / f"{name}.py", dest / f"{name}.py")
    (dest / "pyproject.toml").write_text(app_pyproject(run_config), encoding="utf-8")
    return dest


# ----------------------------------------------------------------------------- the run


class Deployment(NamedTuple):
    """What :func:`run_deployment` did: the run id, its final ``flwr ls`` entry, the PIDs it
    started (all stopped) and where the process logs are."""

    run_id: int | None
    status: dict
    pids: list[int]
    log_dir: Path


def _wait_port(host: str, port: int, procs: Processes, name: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if name in procs.exited():
            raise DeploymentError(f"{name} exited with status {procs.exited()[name]}: "
                                  f"{_one_line(procs.log_tail(name))}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
    raise DeploymentError(f"{name} did not listen on {host}:{port} within {deadline_s:.0f} s")


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
                   keep_dir: Path | None = None, partition_cache: bool = True) -> Deployment:
    """Run the experiment of ``run_config`` (a full kebab-case run config with an absolute
    ``output-dir``) on a TLS + SuperNode-authentication deployment on this machine.

    Raises :class:`DeploymentError` (one line) when the deployment cannot start or the run does
    not finish ``completed``; :class:`fedbayes_flwr.runtime.engine.Interrupted` after a Ctrl-C (the
    finished updates stay in ``output-dir``). Every process started is stopped before it
    returns or raises. ``node_config`` adds keys to every SuperNode's node config;
    ``keep_dir`` keeps a copy of the private directory there (for debugging; it holds keys);
    ``partition_cache=False`` leaves ``cache-dir`` out of the node config (every message then
    loads and splits the data again: the benchmark's "before").
    """
    from fedbayes_flwr.runtime.engine import Interrupted, check_stop

    output_dir = Path(str(run_config["output-dir"]))
    num_clients = int(run_config["num-clients"])
    log_dir = output_dir / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
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
        with _sigterm_raises():
            tls = make_tls(work / "tls", host)
            keys = [make_node_key(work / "keys", f"supernode-{k}") for k in range(num_clients)]
            copy_app(app_dir, run_config)
            port = free_port(host)
            procs.start("superlink", [
                executable("flower-superlink"), "--host", host, "--port", str(port),
                "--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert),
                "--ssl-keyfile", str(tls.server_key), "--enable-supernode-auth",
                "--disable-runtime-dependency-installation"])
            write_connection(flwr_home, f"{host}:{port}", tls.ca_cert)
            _wait_port(host, port, procs, "superlink", STARTUP_TIMEOUT_S)
            register_keys(keys, env, work)
            extra = " ".join(f"{k}={_toml_value(v)}" for k, v in (node_config or {}).items())
            for k, key in enumerate(keys):
                config = f"partition-id={k} num-partitions={num_clients} {extra}"
                if partition_cache:
                    config += f" cache-dir={_toml_value(str(work / 'cache' / str(k)))}"
                procs.start(f"supernode-{k}", [
                    executable("flower-supernode"), "--superlink", f"{host}:{port}",
                    "--root-certificates", str(tls.ca_cert), "--auth-supernode-private-key",
                    str(key.private), "--port", str(free_port(host)), "--node-config",
                    config.strip()])
            say(f"SuperLink {host}:{port} (TLS, SuperNode authentication), {num_clients} "
                f"SuperNodes; logs in {log_dir}")
            proc = flwr(["run", str(app_dir), CONNECTION, "--format", "json"], env, work)
            payload = last_json(proc.stdout)
            if not payload.get("success") or "run-id" not in payload:
                raise DeploymentError(f"flwr run failed: {_one_line(proc.stdout)}")
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
                (log_dir / "serverapp.log").write_text(re.sub(r"\x1b\[[0-9;]*m", "",
                                                              logs.stdout))
        pids = procs.stop_all()
        (log_dir / "processes.json").write_text(json.dumps(
            {"started": {name: p.pid for name, p in procs.started.items()},
             "stopped": pids}, indent=2))
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
    SuperLink exits; report each newly recorded update."""
    start, seen, status = time.monotonic(), 0, {}
    while True:
        check_stop()
        dead = procs.exited()
        if dead:
            name, code = sorted(dead.items())[0]
            raise DeploymentError(f"{name} exited with status {code} during run {run_id}: "
                                  f"{_one_line(procs.log_tail(name))}")
        status = run_status(run_id, env, cwd) or status
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
