"""Processes on this machine, read from Linux ``/proc``: descendants, liveness, start times,
environment markers, and the CLI's watchdog that stops everything a run started when the run
ends, however it ends (even by SIGKILL).

Standard library only (the watchdog runs as ``python -m fedbayes_flwr.deploy.watchdog PID TOKEN``
and must start fast). Off Linux the readers return empty results and :func:`start_reaper`
does nothing.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

RUN_TOKEN = "FEDBAYES_RUN_TOKEN"  # every process a reaped run starts inherits RUN_TOKEN=<hex>
POLL_S = 0.5  # how often the watchdog notes the run's descendants
STOP_GRACE_S = ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0))  # the watchdog's stop sequence


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``state`` first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pids() -> list[int]:
    """Every process ID in ``/proc`` (empty where there is no ``/proc``)."""
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks after boot), or None when it is gone.

    With the PID it tells a process from a later one that reuses its PID.
    """
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """True for a live process that is not a zombie.

    Without ``/proc`` (not Linux), True when signal 0 reaches ``pid``.
    """
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] != "Z"
    try:
        os.kill(pid, 0)
    except OSError:  # gone, or not ours
        return False
    return not os.path.isdir("/proc")


def descendants(pid: int) -> set[int]:
    """Every descendant of ``pid`` (children, their children, ...), zombies included.

    One pass over the parent PIDs in ``/proc/<p>/stat``; empty where there is no ``/proc``.
    """
    children: dict[int, list[int]] = {}
    for p in pids():
        fields = _stat_fields(p)
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(p)
    out: set[int] = set()
    todo = [pid]
    while todo:
        kids = [k for k in children.get(todo.pop(), ()) if k not in out]
        out.update(kids)
        todo += kids
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used by ``pid`` and its live descendants (user + system, with what their
    reaped children used), from ``/proc/<p>/stat``; 0.0 where there is no ``/proc``."""
    ticks = 0
    for p in (pid, *descendants(pid)):
        fields = _stat_fields(p)
        try:
            ticks += sum(int(f) for f in fields[11:15]) if fields else 0  # utime..cstime
        except ValueError:
            continue
    return ticks / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.0


def has_env(pid: int, entry: str) -> bool:
    """True when the environment of ``pid`` holds ``entry`` (``NAME=value``) exactly."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry.encode() in f.read().split(b"\0")
    except OSError:  # gone, or not ours
        return False


def with_env(entry: str) -> set[int]:
    """The processes whose environment holds ``entry`` (``NAME=value``), this one excepted."""
    me = os.getpid()
    return {p for p in pids() if p != me and has_env(p, entry)}


# ------------------------------------------------------------------- no process left behind
def watch(parent: int, token: str) -> None:
    """The watchdog: note the descendants of ``parent`` every :data:`POLL_S` seconds until
    standard input reaches end of file (``parent`` has ended, however it ended), then stop
    them and every process whose environment holds ``token`` by PID: SIGTERM, up to 3 s,
    then SIGKILL, up to 1 s.

    Parameters
    ----------
    parent : int
        The PID whose descendants to stop (the CLI).
    token : str
        ``FEDBAYES_RUN_TOKEN=<hex>``: Ray re-parents some of its own processes, which still
        carry the run's token.

    Notes
    -----
    A noted PID is stopped only while its start time is unchanged (not a reused PID).
    """
    seen: dict[int, int | None] = {}
    while True:  # until EOF on stdin: the CLI has ended, however it ended (even SIGKILL)
        for pid in descendants(parent):
            seen.setdefault(pid, start_time(pid))
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready and not os.read(sys.stdin.fileno(), 1024):
            break

    def remaining() -> set[int]:
        pids_ = {p for p, t in seen.items() if t is not None and start_time(p) == t}
        # zombies are gone (only their parent can reap them): waiting on them would keep the
        # watchdog itself alive for the whole grace period
        return {p for p in (pids_ | with_env(token)) - {os.getpid()} if alive(p)}

    for sig, grace in STOP_GRACE_S:
        left, deadline = remaining(), time.monotonic() + grace
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = remaining()


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_reaper: list = []  # the watchdog's Popen: its stdin pipe lives exactly as long as this process


def start_reaper() -> None:
    """Make sure nothing this process starts outlives it, even when it is killed with SIGKILL.

    Ray's GCS, raylet, agents and actors would otherwise linger for a minute or more. A small
    watchdog process (:func:`watch`) notes this process's descendants every 0.5 s (and every
    process started from here on inherits ``FEDBAYES_RUN_TOKEN=<random>``, which it also looks
    for, since Ray re-parents some of its own); when this process ends (the watchdog's stdin
    pipe closes) it stops exactly those, by PID (SIGTERM, then SIGKILL after 3 s). Linux only
    (reads ``/proc``); a second call does nothing.
    """
    import subprocess
    import uuid

    if _reaper or not os.path.isdir("/proc/self"):
        return
    token = f"{RUN_TOKEN}={uuid.uuid4().hex}"
    _reaper.append(subprocess.Popen(
        [sys.executable, "-m", "fedbayes_flwr.deploy.watchdog", str(os.getpid()), token],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, cwd=_PACKAGE_ROOT))  # -m imports this very package
    os.environ[RUN_TOKEN] = token.split("=", 1)[1]  # after the watchdog: it lacks the token


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
