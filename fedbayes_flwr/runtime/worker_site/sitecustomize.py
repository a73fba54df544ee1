"""Start-up of a Ray worker started by this project's CLI: quiet TensorFlow, before anything.

Python imports the first ``sitecustomize`` on ``sys.path`` when an interpreter starts (the
``site`` module). The CLI puts this folder first on its Ray workers' ``PYTHONPATH`` (and only
theirs), so every worker runs :func:`fedbayes_flwr.runtime.quiet.quiet_worker` while it is still
single-threaded, before Ray's core worker starts and before Flower's actor module imports
TensorFlow. Then the next ``sitecustomize`` on the path, if any, runs as it would have.
A failure here never stops a worker: it only leaves it loud.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

try:
    from fedbayes_flwr.runtime.quiet import quiet_worker

    quiet_worker()
except Exception:  # noqa: BLE001  (a worker must start whatever happens here)
    pass

_HERE = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    if os.path.abspath(_entry or os.curdir) == _HERE:
        continue
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [_entry])
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        break
