"""The deployment's processes: free ports, Flower's executables, and :class:`Processes`, which
starts each Flower process in its own process group, logs it to a file and stops the whole group
(SIGTERM, then SIGKILL) on success, error, Ctrl-C and SIGTERM. The watchdog that outlives a
killed CLI is :mod:`fedbayes_flwr.deploy.watchdog`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedbayes_flwr.deploy.watchdog import alive, descendants, start_time
from fedbayes_flwr.errors import DeploymentError


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
        self.noted: dict[int, int | None] = {}  # descendant PID -> its start time

    def note(self) -> None:
        """Note the started processes' descendants now: a SuperNode that exits leaves its
        SuperExec (own session) re-parented and retrying; :meth:`stop_all` stops it too."""
        for proc in self.started.values():
            for pid in descendants(proc.pid):
                self.noted.setdefault(pid, start_time(pid))

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        fd = os.open(self.log_dir / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as log:  # owner only, as the keys
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
        pids += [pid for pid, t in self.noted.items()  # orphans of an exited process
                 if pid not in pids and t is not None and start_time(pid) == t]
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
def sigterm_raises():
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
