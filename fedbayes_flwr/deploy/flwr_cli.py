"""Flower's command line, driven as subprocesses with a private ``FLWR_HOME``: the environment,
the SuperLink connection entry, ``flwr supernode register``, run status, and the copy of the app
whose ``[tool.flwr.app.config]`` is this run's full run config.

References
----------
../shared/FLOWER_NOTES.md, "Deployment with TLS and node authentication" (the verified flwr 1.42
sequence).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from fedbayes_flwr.deploy.processes import executable
from fedbayes_flwr.deploy.tls import NodeKey
from fedbayes_flwr.errors import DeploymentError

CONNECTION = "fedbayes-deployment"  # the SuperLink connection name in the private FLWR_HOME
APP_PACKAGES = ("fedbayes_flwr", "strategies", "clients")
ROOT = Path(__file__).resolve().parents[2]  # the app's root (pyproject.toml)
CLI_TIMEOUT_S = 120.0
STARTUP_TIMEOUT_S = 60.0


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
                  deadline_s: float = STARTUP_TIMEOUT_S) -> list[int]:
    """``flwr supernode register`` every public key (in parallel), retrying while the SuperLink
    is still starting; raise :class:`DeploymentError` with Flower's answer otherwise. Returns
    the node id the SuperLink gave each key (in the order of ``keys``; ids are fixed at
    registration)."""
    pending, end = list(keys), time.monotonic() + deadline_s
    node_ids: dict[Path, int] = {}
    while pending:
        procs = [(key, subprocess.Popen(
            [executable("flwr"), "supernode", "register", str(key.public), CONNECTION,
             "--format", "json"], env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)) for key in pending]
        failed = []
        for key, proc in procs:
            out, _ = proc.communicate(timeout=CLI_TIMEOUT_S)
            answer = last_json(out)
            if not answer.get("success") or "node-id" not in answer:
                failed.append((key, out))
            else:
                node_ids[key.public] = int(answer["node-id"])
        if failed and time.monotonic() > end:
            key, out = failed[0]
            raise DeploymentError(f"flwr supernode register {key.public.name} failed: "
                                  f"{one_line(out)}")
        pending = [key for key, _ in failed]
        if pending:
            time.sleep(1.0)
    return [node_ids[key.public] for key in keys]


def node_status(env: dict[str, str], cwd: Path) -> dict[int, str]:
    """``flwr supernode list`` -> ``{node id: status}`` (``registered``, ``online``,
    ``offline`` ...); ``{}`` when the SuperLink does not answer."""
    payload = last_json(flwr(["supernode", "list", CONNECTION, "--format", "json"], env,
                             cwd).stdout)
    return {int(n["node-id"]): str(n.get("status", "")) for n in payload.get("nodes", [])
            if str(n.get("node-id", "")).isdigit()}


# what a SuperNode logs when the TLS handshake with the SuperLink fails (flwr 1.42: "SSL/TLS
# handshake error detected", exit code 305, then the ssl module's reason)
TLS_FAILURE = re.compile(r"handshake error|^\[SSL|CERTIFICATE_VERIFY_FAILED|certificate verify "
                         r"failed|WRONG_VERSION_NUMBER", re.IGNORECASE)


def tls_failure(log_text: str) -> str | None:
    """The most specific TLS error line of a SuperNode's log (the ``[SSL: ...]`` reason when
    there is one), or None when the log shows no TLS failure."""
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", log_text).splitlines()
             if TLS_FAILURE.search(ln)]
    reasons = [ln for ln in lines if ln.startswith("[SSL")] or lines
    return reasons[0][:300] if reasons else None


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if ln.strip()]
    return lines[-1][:400] if lines else "(no output)"


def list_runs(env: dict[str, str], cwd: Path) -> dict[int, dict]:
    """``flwr ls`` (every run on the SuperLink) -> ``{run id: entry}``; ``{}`` when the
    SuperLink does not answer."""
    payload = last_json(flwr(["ls", CONNECTION, "--format", "json"], env, cwd).stdout)
    return runs_of(payload)


def runs_of(payload: dict) -> dict[int, dict]:
    """``{run id: entry}`` of a ``flwr ls --format json`` answer (entries without an integer
    ``run-id`` are skipped)."""
    out = {}
    for entry in payload.get("runs", []):
        with contextlib.suppress(TypeError, ValueError):
            out[int(entry["run-id"])] = entry
    return out


def run_status(run_id: int, env: dict[str, str], cwd: Path) -> dict:
    """``flwr ls --run-id`` -> the run's entry (``status``, ``status-details`` ...), ``{}`` when
    the SuperLink does not answer."""
    payload = last_json(flwr(["ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
                             env, cwd).stdout)
    runs = [r for r in payload.get("runs", []) if int(r.get("run-id", -1)) == run_id]
    return runs[0] if runs else {}


def toml_value(value) -> str:
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
        lines.append(f"{key} = {toml_value(project[key])}")
    lines.append("dependencies = [" + ", ".join(toml_value(d) for d in
                                                project.get("dependencies", [])) + "]")
    lines += ["", "[tool.hatch.build.targets.wheel]",
              f"packages = [{', '.join(toml_value(p) for p in APP_PACKAGES)}]",
              "", "[tool.flwr.app]", f"publisher = {toml_value(app['publisher'])}",
              "", "[tool.flwr.app.components]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in app["components"].items()]
    lines += ["", "[tool.flwr.app.config]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in run_config.items()]
    return "\n".join(lines) + "\n"


def copy_app(dest: Path, run_config: dict) -> Path:
    """The app's packages (``.py`` files), the top-level package of each plugin module in
    ``algorithm-modules`` or ``model-modules`` that lives in this repository, and :func:`app_pyproject`."""
    dest.mkdir(parents=True, exist_ok=True)
    names = set(APP_PACKAGES)
    plugins = f"{run_config.get('algorithm-modules', '')},{run_config.get('model-modules', '')}"
    for module in plugins.split(","):
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


