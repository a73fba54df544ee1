"""fedbayes_flwr: federated Bayesian learning, the library half.

Pure maths, models, data and metrics. Imports TensorFlow / TFP but never Flower, except for
:mod:`fedbayes_flwr.codec`, the single module that converts library states to Flower records.

The Python API (:mod:`fedbayes_flwr.api`): :func:`fit` runs a run config and returns a
:class:`Run`; :func:`load` reads one back from its output directory. They are imported on first
use, so ``import fedbayes_flwr`` stays light (no TensorFlow). :func:`compare` runs several
algorithms on one data set against a reference posterior (:mod:`fedbayes_flwr.comparison`).
"""

import os
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedbayes_flwr.api import FittedPosterior, Run, fit, load
    from fedbayes_flwr.comparison import compare

# TensorFlow logs a screenful of CUDA/oneDNN notices at import; keep user output readable.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:  # the version is written once, in pyproject.toml
    __version__ = metadata.version("fedbayes-flwr")
except metadata.PackageNotFoundError:  # a source tree that was never installed (a FAB copy)
    __version__ = "0+unknown"

_API = ("FittedPosterior", "Run", "fit", "load")
__all__ = ["FittedPosterior", "Run", "__version__", "compare", "fit", "load"]


def __getattr__(name: str) -> Any:
    """:func:`fit`, :func:`load`, :class:`Run`, :class:`FittedPosterior`, from
    :mod:`fedbayes_flwr.api` on first access (it imports TensorFlow)."""
    if name in _API:
        import fedbayes_flwr.api as api

        return getattr(api, name)
    if name == "compare":
        from fedbayes_flwr.comparison import compare

        return compare
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
