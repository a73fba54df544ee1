"""One run per output directory: a lock file holding the owner's PID and start time.

A run takes ``<output-dir>/run.lock`` before it writes anything there and removes it when it
ends, however it ends (the context manager's ``finally``). A second run on the same directory
is refused in one line naming the live owner. A lock left by a process that is gone (``kill -9``,
a power cut) is taken over with a warning: the owner is alive only if its PID exists *and* that
process started when the lock says (``/proc/<pid>/stat`` field 22 on Linux), so a reused PID
does not hold a directory forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator

from fedbayes_flwr.errors import ConfigError

FILE = "run.lock"


class OutputDirBusy(ConfigError):
    """Another live run holds the output directory."""


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), else ``None``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(holder: dict) -> bool:
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0 or holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    ticks = holder.get("start_ticks")
    return ticks is None or _start_ticks(pid) in (None, ticks)


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) \
        if isinstance(started, int | float) else "an unknown time"
    return f"PID {holder.get('pid')} (started {when})"


@contextlib.contextmanager
def output_dir_lock(output_dir: str) -> Iterator[str]:
    """Hold ``<output_dir>/run.lock`` for the duration of the ``with`` block.

    Raises
    ------
    OutputDirBusy
        A live process holds the lock: ``output-dir '...' is in use by the run of PID n
        (started ...)``.
    """
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, FILE)
    me = {"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()),
          "host": socket.gethostname(), "started": time.time()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                with open(path) as f:
                    holder = json.load(f)
                if not isinstance(holder, dict):
                    holder = {}
            except (OSError, ValueError):
                holder = {}
            if holder.get("pid") == os.getpid() and holder.get("start_ticks") == \
                    me["start_ticks"]:
                raise OutputDirBusy(f"output-dir {output_dir!r} is in use by another run of "
                                    f"this process") from None
            if _alive(holder):
                raise OutputDirBusy(f"output-dir {output_dir!r} is in use by the run of "
                                    f"{_describe(holder)}; wait for it to end or choose "
                                    f"another --output-dir") from None
            warnings.warn(f"output-dir {output_dir!r}: taking over the lock of "
                          f"{_describe(holder)}, which is no longer running", stacklevel=3)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    else:
        raise OutputDirBusy(f"output-dir {output_dir!r}: cannot take {path} (another run "
                            f"keeps taking it)")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            with open(path) as f:
                if json.load(f).get("pid") == me["pid"]:
                    os.remove(path)
