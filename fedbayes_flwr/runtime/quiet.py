"""TensorFlow's start-up lines kept off the console, in this process and in worker processes.

TensorFlow writes its C++ start-up notices (oneDNN, "Could not find cuda drivers", the absl
"All log messages before absl::InitializeLog()" banner) straight to file descriptor 2 while it
loads, before ``TF_CPP_MIN_LOG_LEVEL`` applies to them; later C++ notices (``cuInit`` failures)
do honour ``TF_CPP_MIN_LOG_LEVEL=3``. So a process that must stay quiet sets the level before
TensorFlow loads and imports TensorFlow with descriptor 2 pointed at ``/dev/null``.

:func:`quiet_tensorflow_import` does that for whoever imports TensorFlow first in a process: it
sets :data:`WORKER_ENV` and puts a finder on ``sys.meta_path`` that runs TensorFlow's import, when
it comes, with the descriptor silenced. :func:`quiet_worker` calls it in each Ray
worker the CLI starts, at interpreter start-up (``worker_site/sitecustomize.py``, first on the
workers' ``PYTHONPATH``), and drops the "Manually terminating ClientAppActor" line each actor
logs when the run ends. It runs while the worker is single-threaded: Ray's own
``worker_process_setup_hook`` runs next to the core worker's threads, and with it a worker
aborted ("absl Mutex corrupt") in three of six trial runs here (the cause was not isolated).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

__all__ = ["WORKER_ENV", "WORKER_SITE", "quiet_tensorflow_import", "quiet_worker", "silenced_stderr_fd"]

WORKER_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")
"""The folder whose ``sitecustomize.py`` runs :func:`quiet_worker` at a worker's start-up."""

WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}
"""Environment of worker processes (Ray actors): C++ notices below FATAL off (the ``cuInit``
failure of a machine without a GPU is logged as an ERROR)."""


@contextlib.contextmanager
def silenced_stderr_fd() -> Iterator[None]:
    """Send file descriptor 2 to ``/dev/null`` for the block (C-level writes included); Python
    exceptions raised in the block propagate after the descriptor is restored."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader with :meth:`exec_module` run under :func:`silenced_stderr_fd`."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with silenced_stderr_fd():
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # resources, is_package, ...: the real loader's
        return getattr(self.loader, name)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, as the other finders do, and hands it the quiet loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: the package's own submodules load as usual
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") \
                else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


def quiet_tensorflow_import() -> None:
    """Set :data:`WORKER_ENV` (where the environment does not set it) and make this process's
    first ``import tensorflow`` run with file descriptor 2 silenced (a ``sys.meta_path`` finder,
    removed once used). Imports nothing; a no-op where TensorFlow is already imported.

    References
    ----------
    PEP 451, "A ModuleSpec Type for the Import System" (finders return a spec whose loader
    executes the module); TensorFlow issue 100442 (``TF_CPP_MIN_LOG_LEVEL`` does not silence
    the import-time lines).
    """
    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlowFinder)
                                          for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlowFinder())


class _DropLines(logging.Filter):
    """Drop log records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


WORKER_DROPPED = ("Manually terminating",)
"""Flower log lines a Ray actor prints that say nothing to the user (its own shutdown)."""


def quiet_worker() -> None:
    """Start-up of a Ray worker (``worker_site/sitecustomize.py``):
    :func:`quiet_tensorflow_import`, and Flower's logger (``"flwr"``) without the lines of
    (``import fedbayes_flwr`` itself defaults ``TF_CPP_MIN_LOG_LEVEL`` to 2). Imports neither
    TensorFlow nor Flower.

    References
    ----------
    The Python documentation of the ``site`` module (``sitecustomize`` is imported at start-up,
    after ``PYTHONPATH`` is on ``sys.path``).
    """
    os.environ.update(WORKER_ENV)
    quiet_tensorflow_import()
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropLines) for f in logger.filters):
        logger.addFilter(_DropLines(WORKER_DROPPED))
