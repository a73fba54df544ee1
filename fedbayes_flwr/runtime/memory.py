"""The memory guard: refuse a run whose large arrays cannot fit before allocating them.

Each bundle states what it will hold (its ``memory_estimate`` hook:
:class:`fedbayes_flwr.algorithms.base.MemoryEstimate`, e.g. PVI's full covariance
``(2 K + 4) d^2 x 8`` bytes); :func:`check_memory` compares it with the memory the system has
available (:func:`available_bytes`, ``MemAvailable`` of ``/proc/meminfo``) and raises a one-line
:class:`fedbayes_flwr.errors.ConfigError` giving the estimate, the available memory and the
alternative. Both engines and the Python API reach it through
:func:`fedbayes_flwr.runtime.experiment.assemble`, before the prior is built.
"""

from __future__ import annotations

import os

from fedbayes_flwr.errors import ConfigError

MEMINFO = "/proc/meminfo"


def available_bytes(meminfo: str = MEMINFO) -> int | None:
    """Memory available to a new process, in bytes: ``MemAvailable`` of ``meminfo`` (Linux
    3.14+); without it, free physical pages (``os.sysconf``); None when neither is known.

    References
    ----------
    proc(5), Linux man-pages, ``/proc/meminfo`` ("MemAvailable: an estimate of how much memory
    is available for starting new applications, without swapping").
    """
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    value, *unit = line.split(":", 1)[1].split()
                    return int(value) * (1024 if unit[:1] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def format_bytes(n: float) -> str:
    """``n`` bytes with a binary unit (``298 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def check_memory(bundle, setup, available: int | None = None) -> None:
    """Raise :class:`ConfigError` (one line) when ``bundle``'s estimate for ``setup`` (a
    :class:`~fedbayes_flwr.algorithms.base.Setup` without its prior) exceeds ``available``
    bytes (default :func:`available_bytes`; no check when it is unknown).

    References
    ----------
    proc(5), Linux man-pages (``MemAvailable``); each bundle's ``memory_estimate`` docstring
    gives its formula.
    """
    hook = bundle.memory_estimate
    estimate = None if hook is None else hook(setup)
    if estimate is None:
        return
    available = available_bytes() if available is None else available
    if available is None or estimate.nbytes <= available:
        return
    raise ConfigError(f"memory: {bundle.name} needs about {format_bytes(estimate.nbytes)} "
                      f"({estimate.formula}) but {format_bytes(available)} is available "
                      f"(MemAvailable); {estimate.alternative}")
